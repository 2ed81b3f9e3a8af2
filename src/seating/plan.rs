//! A seated SKU's plan, parsed and checked once at the edge; seat ids to bits and back.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Most seats in one SKU: a large stadium and some (25 KB of map).
pub const MAX_SEATS: u32 = 200_000;
/// Most seats in one row: the best-available search reads a row whole.
pub const MAX_ROW_SEATS: u32 = 1_000;

/// A refused plan or seat id, said in words for a 400's detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PlanError(pub String);

fn refuse<T>(msg: impl Into<String>) -> Result<T, PlanError> {
    Err(PlanError(msg.into()))
}

/// One row: its name, its seat count, and the bit of its seat 1 in the map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub name: String,
    pub count: u32,
    pub offset: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    pub rows: Vec<Row>,
    /// Its rows as the search reads them ([`SeatPlan::rows_spec`]), made once: a claim sends
    /// it as is instead of formatting every row of the section per request.
    spec: Arc<str>,
}

/// The plan as declared: sections and rows in declared order (first = best).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeatPlan {
    sections: Vec<Section>,
    seats: u32,
    /// Every row as the search reads them, made once (see [`Section`]'s).
    spec: Arc<str>,
}

fn spec_of<'a>(rows: impl Iterator<Item = (&'a str, &'a Row)>) -> Arc<str> {
    let parts: Vec<String> = rows
        .map(|(section, r)| format!("{}:{}:{section}-{}-", r.offset, r.count, r.name))
        .collect();
    Arc::from(parts.join(";"))
}

/// The declared JSON: a row list, or a uniform section's row count with `count` seats each.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct SectionBody {
    name: String,
    rows: RowsBody,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    count: Option<u32>,
}

#[derive(Deserialize, Serialize)]
#[serde(untagged)]
enum RowsBody {
    Uniform(u32),
    List(Vec<RowBody>),
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RowBody {
    name: String,
    count: u32,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PlanBody {
    sections: Vec<SectionBody>,
}

/// Section and row names: a seat id is `<section>-<row>-<n>`, so no `-` in either.
fn valid_name(s: &str) -> bool {
    (1..=16).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_')
}

impl SeatPlan {
    /// Parses and checks a declared `seats` value.
    ///
    /// # Errors
    /// A [`PlanError`] naming the first thing wrong (names, counts, repeats, size).
    pub fn parse(value: &serde_json::Value) -> Result<SeatPlan, PlanError> {
        let body: PlanBody =
            serde_json::from_value(value.clone()).map_err(|e| PlanError(format!("seats: {e}")))?;
        if body.sections.is_empty() {
            return refuse("seats: at least one section");
        }
        let mut sections: Vec<Section> = Vec::with_capacity(body.sections.len());
        let mut offset: u32 = 0;
        for s in body.sections {
            if !valid_name(&s.name) {
                return refuse(format!(
                    "seats: section name {:?}: 1-16 of A-Za-z0-9._",
                    s.name
                ));
            }
            if sections.iter().any(|x| x.name == s.name) {
                return refuse(format!("seats: section {} declared twice", s.name));
            }
            let rows: Vec<RowBody> = match (s.rows, s.count) {
                (RowsBody::Uniform(n), Some(count)) if (1..=10_000).contains(&n) => (1..=n)
                    .map(|i| RowBody {
                        name: i.to_string(),
                        count,
                    })
                    .collect(),
                (RowsBody::Uniform(_), _) => {
                    return refuse(format!(
                        "seats: section {}: `rows` as a number needs 1..=10000 and a `count`",
                        s.name
                    ))
                }
                (RowsBody::List(list), None) if !list.is_empty() => list,
                (RowsBody::List(_), _) => {
                    return refuse(format!(
                        "seats: section {}: a row list needs rows and no section `count`",
                        s.name
                    ))
                }
            };
            let mut out: Vec<Row> = Vec::with_capacity(rows.len());
            for r in rows {
                if !valid_name(&r.name) || out.iter().any(|x| x.name == r.name) {
                    return refuse(format!(
                        "seats: section {}: row name {:?} invalid or repeated",
                        s.name, r.name
                    ));
                }
                if !(1..=MAX_ROW_SEATS).contains(&r.count) {
                    return refuse(format!(
                        "seats: row {}-{}: count must be in 1..={MAX_ROW_SEATS}",
                        s.name, r.name
                    ));
                }
                out.push(Row {
                    name: r.name,
                    count: r.count,
                    offset,
                });
                offset = offset.saturating_add(r.count);
                if offset > MAX_SEATS {
                    return refuse(format!("seats: more than {MAX_SEATS} seats"));
                }
            }
            let spec = spec_of(out.iter().map(|r| (s.name.as_str(), r)));
            sections.push(Section {
                name: s.name,
                rows: out,
                spec,
            });
        }
        let spec = spec_of(
            sections
                .iter()
                .flat_map(|s| s.rows.iter().map(move |r| (s.name.as_str(), r))),
        );
        Ok(SeatPlan {
            sections,
            seats: offset,
            spec,
        })
    }

    /// The plan as stored in the catalog (rows listed in full).
    pub fn to_json(&self) -> serde_json::Value {
        let body = PlanBody {
            sections: self
                .sections
                .iter()
                .map(|s| SectionBody {
                    name: s.name.clone(),
                    rows: RowsBody::List(
                        s.rows
                            .iter()
                            .map(|r| RowBody {
                                name: r.name.clone(),
                                count: r.count,
                            })
                            .collect(),
                    ),
                    count: None,
                })
                .collect(),
        };
        serde_json::to_value(body).unwrap_or_default()
    }

    /// The number of seats (the SKU's total).
    pub fn seats(&self) -> u32 {
        self.seats
    }

    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// The section named `name`.
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// The map's size in bytes (one bit per seat).
    pub fn map_bytes(&self) -> usize {
        (self.seats as usize).div_ceil(8)
    }

    /// The bit of a seat id `<section>-<row>-<n>`.
    ///
    /// # Errors
    /// A [`PlanError`] for an id that names no seat of this plan.
    pub fn bit_of(&self, id: &str) -> Result<u32, PlanError> {
        let unknown = || PlanError(format!("unknown seat {id:?}"));
        let mut it = id.splitn(3, '-');
        let (s, r, n) = (it.next(), it.next(), it.next());
        let (Some(s), Some(r), Some(n)) = (s, r, n) else {
            return Err(unknown());
        };
        let row = self
            .section(s)
            .and_then(|sec| sec.rows.iter().find(|x| x.name == r))
            .ok_or_else(unknown)?;
        let n: u32 = n.parse().map_err(|_| unknown())?;
        if !(1..=row.count).contains(&n) || n.to_string().len() != id.len() - s.len() - r.len() - 2
        {
            return Err(unknown());
        }
        Ok(row.offset + n - 1)
    }

    /// The seat id of a bit (`None` past the last seat).
    pub fn id_of(&self, bit: u32) -> Option<String> {
        self.sections.iter().find_map(|s| {
            s.rows
                .iter()
                .find(|r| (r.offset..r.offset + r.count).contains(&bit))
                .map(|r| format!("{}-{}-{}", s.name, r.name, bit - r.offset + 1))
        })
    }

    /// The rows of the plan (or of one section) as the best-available search reads them
    /// (`lua/lib/seats.lua`): `offset:count:prefix;...` in declared order, best first; an
    /// unknown section has none.
    pub fn rows_spec(&self, section: Option<&str>) -> Arc<str> {
        match section {
            None => self.spec.clone(),
            Some(name) => self
                .section(name)
                .map_or_else(|| Arc::from(""), |s| s.spec.clone()),
        }
    }

    /// Every row of the plan (or of one section), in declared order.
    pub fn rows_of<'a>(&'a self, section: Option<&'a str>) -> impl Iterator<Item = &'a Row> + 'a {
        self.sections
            .iter()
            .filter(move |s| section.is_none_or(|n| n == s.name))
            .flat_map(|s| s.rows.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_uniform_section_and_a_row_list_number_seats_in_declared_order() {
        let p = SeatPlan::parse(&json!({"sections": [
            {"name": "A", "rows": [{"name": "1", "count": 3}, {"name": "2", "count": 2}]},
            {"name": "B", "rows": 2, "count": 4}]}))
        .unwrap();
        assert_eq!(p.seats(), 13);
        assert_eq!(p.map_bytes(), 2);
        assert_eq!(p.bit_of("A-1-1"), Ok(0));
        assert_eq!(p.bit_of("A-2-2"), Ok(4));
        assert_eq!(p.bit_of("B-2-4"), Ok(12));
        assert_eq!(p.id_of(12).as_deref(), Some("B-2-4"));
        assert_eq!(p.id_of(13), None);
        assert_eq!(SeatPlan::parse(&p.to_json()).unwrap(), p);
    }

    #[test]
    fn ids_that_name_no_seat_are_refused() {
        let p =
            SeatPlan::parse(&json!({"sections": [{"name": "A", "rows": 1, "count": 3}]})).unwrap();
        for bad in [
            "A-1-0", "A-1-4", "A-2-1", "B-1-1", "A-1", "A-1-01", "A-1-+1", "",
        ] {
            assert!(p.bit_of(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_plans_are_refused_with_words() {
        for bad in [
            json!({"sections": []}),
            json!({"sections": [{"name": "A-B", "rows": 1, "count": 1}]}),
            json!({"sections": [{"name": "A", "rows": 1}]}),
            json!({"sections": [{"name": "A", "rows": 1, "count": 0}]}),
            json!({"sections": [{"name": "A", "rows": 1, "count": 1},
                                {"name": "A", "rows": 1, "count": 1}]}),
            json!({"sections": [{"name": "A", "rows": [{"name": "1", "count": 1},
                                                       {"name": "1", "count": 1}]}]}),
            json!({"sections": [{"name": "A", "rows": 300, "count": 1000}]}),
            json!({"sections": [{"name": "A", "rows": 1, "count": 1, "x": 1}]}),
        ] {
            assert!(SeatPlan::parse(&bad).is_err(), "{bad}");
        }
    }
}
