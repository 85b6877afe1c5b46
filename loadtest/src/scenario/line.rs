//! A buyer of a sale with a waiting room (`--waiting-room-rate`,
//! `--waiting-room-concurrency`): joins the sale's line, looks at the place
//! until it is admitted or told sold out, and then buys with the admission
//! (docs/waiting-room.md). The joins and looks are goose requests of their
//! own names, so the purchases' figures stay the purchases'.

use super::*;

/// Goose's name for a join.
pub const JOIN: &str = "join line";
/// Goose's name for a look at a place.
pub const LOOK: &str = "look at place";

/// How long a buyer waits in line at most before giving up.
const GIVE_UP: Duration = Duration::from_secs(300);

/// What the line did for one buyer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// Admitted: the admission to buy with.
    Admitted(String),
    /// Told sold out while waiting.
    SoldOut,
    /// No turn: the place was lost twice, or the wait passed [`GIVE_UP`].
    Lost,
}

/// How long to wait before the next look: half the estimated wait, between
/// 100 ms and `longest` (`--waiting-room-look-max-ms`; a place not looked at
/// for 10 s is given up), and 200 ms while the line has no pace yet. So a
/// buyer near the head looks often and one far back rarely, as a page that
/// paced its looks would: thousands of buyers in line looking every 100 ms
/// would be a load test of the looks.
pub fn next_look(place: &Value, longest: Duration) -> Duration {
    let half = place["estimated_wait_ms"].as_u64().map(|ms| ms / 2).unwrap_or(200);
    Duration::from_millis(half).clamp(Duration::from_millis(100), longest)
}

impl Attack {
    /// Takes `buyer`'s place in `sale`'s line and waits for their turn,
    /// looking at most `longest` apart.
    pub(super) async fn wait_in_line(
        &self,
        user: &mut GooseUser,
        sale: i64,
        buyer: i64,
        longest: Duration,
    ) -> Result<Turn, Box<TransactionError>> {
        let started = Instant::now();
        let mut joins = 0;
        let mut place = Value::Null;
        while started.elapsed() < GIVE_UP {
            let (status, body) = if place.is_null() {
                joins += 1;
                if joins > 2 {
                    return Ok(Turn::Lost);
                }
                self.line_request(user, sale, buyer, true).await?
            } else {
                self.line_request(user, sale, buyer, false).await?
            };
            match (status, body["state"].as_str()) {
                (200, Some("admitted")) => {
                    let admission = body["admission"].as_str().unwrap_or_default().to_owned();
                    return Ok(Turn::Admitted(admission));
                }
                (200, Some("sold_out")) => return Ok(Turn::SoldOut),
                (200, _) => place = body,
                // The place was lost (Redis restarted, or it was not looked
                // at in time): join again.
                (404, _) => place = Value::Null,
                // Busy, unavailable, no answer: look again shortly.
                _ => {}
            }
            tokio::time::sleep(next_look(&place, longest)).await;
        }
        Ok(Turn::Lost)
    }

    /// `POST /sales/{sale}/line` (`join`) or `GET /sales/{sale}/line/{buyer}`:
    /// the status (0 without an answer) and the JSON body.
    async fn line_request(
        &self,
        user: &mut GooseUser,
        sale: i64,
        buyer: i64,
        join: bool,
    ) -> Result<(u16, Value), Box<TransactionError>> {
        let instance = user.weighted_users_index % self.urls.len();
        let base = &self.urls[instance];
        let (method, url, name, body) = if join {
            (GooseMethod::Post, format!("{base}/sales/{sale}/line"), JOIN, Some(Default::default()))
        } else {
            (GooseMethod::Get, format!("{base}/sales/{sale}/line/{buyer}"), LOOK, None)
        };
        let mut goose = self.send_as(user, method, &url, name, buyer, body).await?;
        let status = goose.request.status_code;
        let (_, body) = read_answer(goose.response).await;
        if matches!(status, 200 | 404) {
            user.set_success(&mut goose.request)?;
        }
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buyer_far_back_looks_rarely_and_one_near_the_head_often() {
        let ms = |place: Value| next_look(&place, Duration::from_secs(2)).as_millis();
        assert_eq!(ms(json!({ "estimated_wait_ms": 20_000 })), 2000);
        assert_eq!(ms(json!({ "estimated_wait_ms": 1_000 })), 500);
        assert_eq!(ms(json!({ "estimated_wait_ms": 40 })), 100);
        assert_eq!(ms(json!({ "estimated_wait_ms": null })), 200);
        assert_eq!(ms(Value::Null), 200);
        let patient = next_look(&json!({ "estimated_wait_ms": 20_000 }), Duration::from_secs(5));
        assert_eq!(patient.as_millis(), 5000);
    }
}
