use super::steps::APPLY_CHANGES;
use super::*;

#[test]
fn every_status_round_trips_as_the_same_lowercase_string() {
    for s in ClaimStatus::ALL {
        assert_eq!(s.as_str().parse::<ClaimStatus>(), Ok(*s));
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        assert_eq!(s.to_string(), s.as_str());
    }
    for s in EntryStatus::ALL {
        assert_eq!(s.as_str().parse::<EntryStatus>(), Ok(*s));
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
    }
    assert_eq!(ClaimStatus::ALL.len(), 6);
    assert_eq!(EntryStatus::ALL.len(), 5);
    assert!("Held".parse::<ClaimStatus>().is_err());
    assert!("left".parse::<ClaimStatus>().is_err());
}

#[test]
fn every_status_is_reached_and_only_a_hold_or_a_live_entry_moves_on() {
    for s in ClaimStatus::ALL {
        assert!(ClaimStatus::reaches(None, *s), "{s} is never reached");
    }
    for s in EntryStatus::ALL {
        assert!(EntryStatus::reaches(None, *s), "{s} is never reached");
    }
    // A hold ends once; a compensation is the end of every claim.
    use ClaimStatus::*;
    for s in [Confirmed, Cancelled, Expired] {
        assert!(ClaimStatus::allowed(Some(Held), s));
        assert!(!ClaimStatus::allowed(Some(s), Held));
    }
    assert!(!ClaimStatus::allowed(Some(Cancelled), Confirmed));
    assert!(!ClaimStatus::allowed(Some(Issued), Confirmed));
    for s in ClaimStatus::ALL {
        assert!(!ClaimStatus::allowed(Some(Compensated), *s));
    }
    // An entry only moves forward.
    for (from, to) in EntryStatus::ALL
        .iter()
        .flat_map(|f| EntryStatus::ALL.iter().map(move |t| (*f, *t)))
    {
        if EntryStatus::reaches(Some(from), to) {
            assert!(from.rank() < to.rank(), "{from} -> {to} goes back");
        }
    }
    assert!(EntryStatus::reaches(
        Some(EntryStatus::Waiting),
        EntryStatus::Claimed
    ));
    assert!(!EntryStatus::allowed(
        Some(EntryStatus::Waiting),
        EntryStatus::Claimed
    ));
}

#[test]
fn the_hold_changes_are_the_steps_out_of_held_the_writer_records() {
    let recorded: Vec<ClaimStatus> = CLAIM_STEPS
        .iter()
        .filter(|s| s.from == Some(ClaimStatus::Held) && s.recorded_by.contains(&APPLY_CHANGES))
        .map(|s| s.to)
        .collect();
    let changes: Vec<ClaimStatus> = ClaimStatus::ALL
        .iter()
        .copied()
        .filter(|s| s.is_hold_change())
        .collect();
    assert_eq!(recorded, changes);
}

#[test]
fn a_ticket_leaves_the_line_once_and_never_comes_back() {
    for s in TicketState::ALL {
        assert_eq!(s.as_str().parse::<TicketState>(), Ok(*s));
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        assert!(TicketState::reaches(None, *s), "{s} is never reached");
    }
    assert_eq!(TicketState::SoldOut.as_str(), "sold_out");
    // Admission is the only way out of the line, and nothing leads back into it.
    for st in TICKET_STEPS {
        let (Some(from), to) = (st.from, st.to) else {
            assert!(st.to.in_line(), "created as {}", st.to);
            continue;
        };
        if from.in_line() && !to.in_line() {
            assert_eq!(
                (from, to),
                (TicketState::Waiting, TicketState::Admitted),
                "{from} -> {to} leaves the line"
            );
            assert!(st.decided_by.contains(&"lua/admit_queue.lua"));
        }
        assert!(from.in_line() || !to.in_line(), "{from} -> {to} goes back");
        assert!(st.recorded_by.is_empty() && st.events.is_empty());
    }
    // The pre-queue is only ever the first state.
    for s in TicketState::ALL {
        assert!(
            !TicketState::reaches(Some(*s), TicketState::Prequeue),
            "{s}"
        );
    }
}
