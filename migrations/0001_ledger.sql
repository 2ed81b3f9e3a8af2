-- The catalog, the ledger of issued claims, and the claims PostgreSQL refused.

CREATE TABLE skus (
    sku            text        PRIMARY KEY,
    total          bigint      NOT NULL CHECK (total >= 0),
    per_user_limit integer     NOT NULL CHECK (per_user_limit >= 1),
    hold_seconds   integer     NOT NULL DEFAULT 0 CHECK (hold_seconds >= 0),
    -- Set once Redis confirmed the stock; after that a declare never seeds again.
    seeded         boolean     NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE issuances (
    claim_id        uuid        PRIMARY KEY,
    sku             text        NOT NULL,
    user_id         text        NOT NULL,
    quantity        integer     NOT NULL CHECK (quantity >= 1),
    status          text        NOT NULL DEFAULT 'issued'
                    CHECK (status IN ('issued', 'held', 'confirmed', 'cancelled', 'expired', 'compensated')),
    idempotency_key text,
    -- Stock left right after this claim won; replayed responses carry it.
    remaining_after bigint,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX issuances_sku_user ON issuances (sku, user_id);

CREATE TABLE persistence_pending (
    claim_id        uuid        PRIMARY KEY,
    sku             text        NOT NULL,
    user_id         text        NOT NULL,
    quantity        integer     NOT NULL,
    idempotency_key text,
    remaining_after bigint,
    created_at      timestamptz NOT NULL,
    failure_reason  text        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'reprocessing', 'resolved', 'compensated')),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- Who is working on the row, and until when; another reprocessor may take it after that.
    lease_owner     uuid,
    lease_until     timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX persistence_pending_due ON persistence_pending (next_attempt_at)
    WHERE status IN ('pending', 'reprocessing');
CREATE INDEX persistence_pending_sku ON persistence_pending (sku, status);
