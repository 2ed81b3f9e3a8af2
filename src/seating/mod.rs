//! Reserved seating's words (API.md, "Reserved seating"; docs/seats.md): a seated SKU's plan
//! (sections -> rows -> seat counts, in order of quality), seat ids, and where each seat sits
//! in the SKU's seat map in Redis (one bit per seat, rows one after another in declared order:
//! a 100,000-seat stadium is 12.5 KB).

mod plan;

pub use plan::{PlanError, Row, SeatPlan, Section, MAX_ROW_SEATS, MAX_SEATS};
