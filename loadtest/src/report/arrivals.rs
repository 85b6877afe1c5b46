//! The report's lines on who got the units and on open arrivals, shared by
//! report.md and report.html.

use super::Report;
use super::summary::{Spread, Summary};

/// What the fairness lines mean.
pub const FAIRNESS_NOTE: &str = "First served: of the first `stock` distinct buyers to arrive \
(by schedule in `arrival` runs, by first send otherwise), the share that got a unit — 1 is first \
come, first served; serving at random among `demand × stock` buyers gives about 1 / demand. \
Kendall's τ: the rank correlation between arrival order and the order the units were taken \
(`orders.created_at`) among the buyers who got one — 1 in arrival order, 0 unrelated. Median \
over the repeats with the 95 % interval of the mean (from 3 repeats on); docs/report-format.md, \
\"Fairness\".";

/// What the open-arrival lines mean.
pub const ARRIVAL_NOTE: &str = "Buyers arrive on a schedule fixed in advance, whatever the \
service answers; latency counts from each buyer's intended arrival (HDR histogram), so a stall \
shows in full. Late: arrivals sent more than `on_time_ms` after their schedule (all `cap` \
purchases in flight, or the generator itself behind: it sends from a CPU group weighted above the service's unless the line says otherwise); never dropped. The closed-loop p99 beside \
it is goose's, from each request's send. docs/report-format.md, \"Open arrivals\".";

/// `0.83 [0.71–0.95]`, or `0.83` without an interval; `–` without a value.
fn scored(spread: Option<&Spread>) -> String {
    match spread {
        Some(Spread { median, ci95: Some([lo, hi]), .. }) => {
            format!("{median:.2} [{lo:.2}–{hi:.2}]")
        }
        Some(spread) => format!("{:.2}", spread.median),
        None => "–".to_owned(),
    }
}

fn figure<'a>(summary: &'a Summary, path: &str) -> Option<&'a Spread> {
    summary.figures.get(path).and_then(Option::as_ref)
}

/// One line per (strategy, profile, fault) with fairness figures.
pub fn fairness_lines(report: &Report) -> Vec<String> {
    report
        .summary
        .iter()
        .filter(|s| figure(s, "fairness.first_served").is_some())
        .map(|s| {
            let fault = s.fault.as_deref().map(|f| format!(" · {f}")).unwrap_or_default();
            format!(
                "{} ({}{fault}): first served {}, Kendall's τ {} over {} runs",
                s.strategy,
                s.profile,
                scored(figure(s, "fairness.first_served")),
                scored(figure(s, "fairness.kendall_tau")),
                s.runs,
            )
        })
        .collect()
}

/// One line per `arrival` run: its schedule, how well the generator kept
/// it, and its latency from intended arrival beside goose's closed-loop p99.
pub fn arrival_lines(report: &Report) -> Vec<String> {
    report
        .runs
        .iter()
        .filter_map(|run| Some((run, run.arrival.as_ref()?)))
        .map(|(run, a)| {
            let shape = match a.shape {
                Some(crate::scenario::arrival::Shape::Constant) => {
                    format!("{:.0} buyers a second", a.per_s)
                }
                _ => format!("a spike of {:.0} buyers in the first second", a.per_s),
            };
            let weight = match a.generator_cpu_shares {
                Some(shares) => format!("generator at cpu.shares {shares}"),
                None => "generator at the default CPU weight".to_owned(),
            };
            let l = &a.latency_from_arrival_ms;
            let result = a.result_from_arrival_ms.as_ref().map_or(String::new(), |r| {
                format!(
                    "; to the result p50 {:.0}, p99 {:.0}, p99.9 {:.0} ms",
                    r.p50, r.p99, r.p999
                )
            });
            let room = a.room.as_ref().map_or(String::new(), |r| {
                format!(
                    "; waiting room: {} admitted, {} told sold out in line, {} without a turn, \
                     wait in line p50 {:.0}, p99 {:.0} ms, admitted buyers' purchase p50 {:.1}, \
                     p99 {:.1} ms",
                    r.admitted,
                    r.told_sold_out,
                    r.lost,
                    r.wait_ms.p50,
                    r.wait_ms.p99,
                    r.purchase_ms.p50,
                    r.purchase_ms.p99,
                )
            });
            format!(
                "{} #{}: {} arrivals ({shape}; {weight}), {} late (lateness p99 {:.1} ms, max {:.1} ms), \
                 at most {} of {} in flight; from arrival p50 {:.0}, p90 {:.0}, p99 {:.0}, \
                 p99.9 {:.0}, max {:.0} ms{result}; closed-loop p99 {:.0} ms{room}",
                run.strategy,
                run.label(),
                a.scheduled,
                a.late,
                a.lateness_ms.p99,
                a.lateness_ms.max,
                a.in_flight_max,
                a.cap,
                l.p50,
                l.p90,
                l.p99,
                l.p999,
                l.max,
                run.latency_ms.p99,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture;
    use crate::scenario::arrival::{ArrivalRecord, Percentiles, RoomRecord, Shape};

    #[test]
    fn a_score_shows_its_interval_when_it_has_one() {
        let spread = |ci95| Spread { median: 0.5, min: 0.4, max: 0.6, n: 3, ci95 };
        assert_eq!(scored(Some(&spread(Some([0.41, 0.59])))), "0.50 [0.41–0.59]");
        assert_eq!(scored(Some(&spread(None))), "0.50");
        assert_eq!(scored(None), "–");
    }

    #[test]
    fn an_arrival_run_shows_its_schedule_lateness_and_latency_from_arrival() {
        let mut report = fixture::report();
        assert!(arrival_lines(&report).is_empty());
        let run = &mut report.runs[0];
        run.arrival = Some(ArrivalRecord {
            shape: Some(Shape::Spike),
            per_s: 3000.0,
            scheduled: 6000,
            cap: 4000,
            in_flight_max: 2500,
            late: 12,
            on_time_ms: 10.0,
            lateness_ms: Percentiles { p99: 3.5, max: 40.0, ..Percentiles::default() },
            latency_from_arrival_ms: Percentiles {
                p50: 800.0,
                p90: 1500.0,
                p99: 2100.0,
                p999: 2400.0,
                max: 2500.0,
                count: 6000,
            },
            result_from_arrival_ms: None,
            generator_cpu_shares: Some(10_240),
            room: None,
        });
        let line = &arrival_lines(&report)[0];
        let schedule = "6000 arrivals (a spike of 3000 buyers in the first second; generator at";
        assert!(line.contains(schedule), "{line}");
        assert!(line.contains("12 late") && line.contains("p99.9 2400"), "{line}");
        assert!(line.contains("generator at cpu.shares 10240"), "{line}");
        assert!(!line.contains("waiting room"), "{line}");

        let room = RoomRecord {
            admitted: 2000,
            told_sold_out: 3900,
            lost: 100,
            wait_ms: Percentiles { p50: 1200.0, p99: 4100.0, ..Percentiles::default() },
            purchase_ms: Percentiles { p50: 3.2, p99: 9.5, ..Percentiles::default() },
        };
        report.runs[0].arrival.as_mut().unwrap().room = Some(room);
        let line = &arrival_lines(&report)[0];
        let room = "waiting room: 2000 admitted, 3900 told sold out in line, 100 without a turn, \
                    wait in line p50 1200, p99 4100 ms, admitted buyers' purchase p50 3.2, p99 9.5 ms";
        assert!(line.contains(room), "{line}");
    }
}
