//! Integers of request bodies as JSON Schema counts them: a JSON number with
//! no fractional part, written `5` or `5.0` or `5e0`. serde reads `5.0` as a
//! float and refuses it for an integer field, while the OpenAPI document's
//! `"type": "integer"` (JSON Schema 2020-12, section 6.1.1) admits it; these
//! deserializers make the service accept what its document promises. A
//! fraction (`1.5`) or a value out of the field's range is still refused.
//!
//! Use `#[serde(deserialize_with = "integer")]` on an integer field, and
//! `#[serde(default, deserialize_with = "optional_integer")]` on an optional
//! one.

use serde::Deserialize;
use serde::de::{Deserializer, Error};

/// An integer of type `T` from a JSON number without a fractional part.
pub fn integer<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    let number = serde_json::Number::deserialize(deserializer)?;
    let whole = match (number.as_i64(), number.as_f64()) {
        (Some(whole), _) => whole,
        // Within i64 and without a fraction: exact, so the cast loses nothing.
        (None, Some(float))
            if float.fract() == 0.0 && float >= -(2f64.powi(63)) && float < 2f64.powi(63) =>
        {
            float as i64
        }
        _ => return Err(D::Error::custom(format!("invalid type: {number}, expected an integer"))),
    };
    T::try_from(whole).map_err(|_| D::Error::custom(format!("{whole} is out of range")))
}

/// As [`integer`], for an optional field (`null` or absent: `None`).
pub fn optional_integer<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    #[derive(Deserialize)]
    struct Whole(#[serde(deserialize_with = "integer")] i64);
    let whole: Option<Whole> = Option::deserialize(deserializer)?;
    whole
        .map(|Whole(whole)| {
            T::try_from(whole).map_err(|_| D::Error::custom(format!("{whole} is out of range")))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(deserialize_with = "integer")]
        units: i64,
        #[serde(default, deserialize_with = "optional_integer")]
        limit: Option<i32>,
    }

    fn read(body: serde_json::Value) -> Result<(i64, Option<i32>), String> {
        serde_json::from_value::<Body>(body).map(|b| (b.units, b.limit)).map_err(|e| e.to_string())
    }

    #[test]
    fn a_number_without_a_fraction_is_an_integer_however_it_is_written() {
        assert_eq!(read(json!({ "units": 5 })), Ok((5, None)));
        assert_eq!(read(json!({ "units": 5.0, "limit": 2.0 })), Ok((5, Some(2))));
        let text = r#"{ "units": 1e12, "limit": null }"#;
        let body: Body = serde_json::from_str(text).unwrap();
        assert_eq!((body.units, body.limit), (1_000_000_000_000, None));
        assert_eq!(read(json!({ "units": -3 })), Ok((-3, None)));
    }

    #[test]
    fn a_fraction_a_string_or_a_value_out_of_range_is_refused() {
        for body in [
            json!({ "units": 1.5 }),
            json!({ "units": "5" }),
            json!({ "units": 1e19 }),
            json!({ "units": 1, "limit": 3_000_000_000_i64 }),
            json!({ "units": 1, "limit": 0.5 }),
        ] {
            assert!(read(body.clone()).is_err(), "{body}");
        }
    }
}
