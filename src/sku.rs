//! A catalog SKU's id as a type of its own: [`SkuId`], borrowed like `str` (`&SkuId`).
//!
//! Two kinds of name used to travel as the same `&str`: a catalog SKU (a row of `skus`, the
//! `sku` column of every ledger table, what a buyer and an operator name) and a *Redis SKU*,
//! the name a shard's keys carry (`<sku>#<i>`, [`crate::keys::ShardName`]). They coincide for
//! shard 0 and differ for every other shard, so a shard's name passed where the SKU was meant
//! still compiled (a row of a win on shard 2 would have named `drop-1#2`): the writer had to
//! split every name it read back into its SKU, and nothing checked that anyone else did. Now a
//! function that means the catalog SKU takes a `&SkuId`, and one that takes any Redis name
//! keeps a `&str` called `name`: the compiler tells the two apart.
//!
//! A `&SkuId` is a `&str` underneath (`#[repr(transparent)]`, cast by `ref-cast`, no copy),
//! and it deliberately does not deref to one: it goes back into a `&str` slot only through
//! [`SkuId::as_str`], where the reader sees it. Owned SKU ids (rows, records, map keys) stay
//! `String`s; [`crate::catalog::Sku::id`] borrows a catalog row's.

use ref_cast::{ref_cast_custom, RefCastCustom};

/// A catalog SKU's id: `^[A-Za-z0-9._-]{1,64}$` (API.md). No `#`, so it never looks like a
/// shard's Redis name.
#[derive(PartialEq, Eq, PartialOrd, Ord, Hash, RefCastCustom)]
#[repr(transparent)]
pub struct SkuId(str);

impl SkuId {
    /// The longest SKU id, in bytes (all of them ASCII).
    pub const MAX_LEN: usize = 64;

    /// `s` as a SKU id if it is one by the contract (`^[A-Za-z0-9._-]{1,64}$`): what a client
    /// or an operator sends is checked here, once, at the edge.
    pub fn parse(s: &str) -> Option<&SkuId> {
        let valid = (1..=Self::MAX_LEN).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        valid.then(|| SkuId::trusted(s))
    }

    /// `s` as a SKU id, unchecked: for ids read back from our own stores (a catalog or ledger
    /// row, a shard's name split by [`crate::keys::ShardName::sku`]) or kept in this process
    /// (a cache's key, a copy held by a task), which only a checked id got into. Checking them
    /// again would cost every row a scan and could only fail on a store changed by hand.
    #[ref_cast_custom]
    pub const fn trusted(s: &str) -> &SkuId;

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SkuId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SkuId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// As the `str` it is (quoted), so a `{:?}` of a SKU id reads as it did before it had a type.
impl std::fmt::Debug for SkuId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl PartialEq<str> for SkuId {
    fn eq(&self, other: &str) -> bool {
        &self.0 == other
    }
}

impl PartialEq<SkuId> for str {
    fn eq(&self, other: &SkuId) -> bool {
        self == &other.0
    }
}

impl PartialEq<String> for SkuId {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other.as_str()
    }
}

impl serde::Serialize for SkuId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Bound as the text it is (`.bind(sku)`), so a query reads the same with an id as with a `&str`.
impl sqlx::Type<sqlx::Postgres> for SkuId {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <str as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for &SkuId {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <&str as sqlx::Encode<sqlx::Postgres>>::encode_by_ref(&self.as_str(), buf)
    }
}

#[cfg(test)]
mod tests {
    use super::SkuId;

    #[test]
    fn sku_ids_follow_the_contract() {
        assert!(SkuId::parse("drop-1.A_b").is_some());
        assert!(SkuId::parse(&"a".repeat(64)).is_some());
        assert!(SkuId::parse("").is_none());
        assert!(SkuId::parse(&"a".repeat(65)).is_none());
        assert!(SkuId::parse("a{b}").is_none());
        assert!(
            SkuId::parse("a#1").is_none(),
            "a shard's name is not a SKU id"
        );
        assert!(SkuId::parse("é").is_none());
    }

    #[test]
    fn a_sku_id_reads_as_its_str() {
        let id = SkuId::parse("drop-1").unwrap();
        assert_eq!(id.as_str(), "drop-1");
        assert_eq!(id.to_string(), "drop-1");
        assert_eq!(format!("{id:?}"), "\"drop-1\"");
        assert_eq!(serde_json::to_string(id).unwrap(), "\"drop-1\"");
        assert!(*id == *"drop-1");
    }
}
