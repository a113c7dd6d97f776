//! The handlers, one module per resource, and the extractors whose
//! refusals are typed errors (axum's own answer in `text/plain`).

mod agent_choice;
pub(crate) mod ops;
pub(crate) mod sessions;
pub(crate) mod trace;
pub(crate) mod turns;

use axum::extract::{FromRequestParts, Path};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

use crate::api::ErrorType;
use crate::error::ApiError;

/// A route's path parameter (`{id}`, `{key}`), percent-decoded. One that
/// is not UTF-8 once decoded (`%FF`) is a typed `400 invalid_request`.
pub(crate) struct Param(pub(crate) String);

impl<S: Send + Sync> FromRequestParts<S> for Param {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Self(value)),
            Err(r) => Err(ApiError::new(
                match r.status().is_server_error() {
                    true => ErrorType::Internal,
                    false => ErrorType::InvalidRequest,
                },
                format!(
                    "{} (a key or id in the path is UTF-8, percent-encoded)",
                    r.body_text()
                ),
            )),
        }
    }
}

/// A JSON body that must be an object: `T`'s fields by name. serde's
/// derived structs also take an array of the fields in order, which no
/// client means (`["hi"]` is not a turn); an array (or any other JSON
/// value) is refused like a field of the wrong type (`422 invalid_fields`).
pub(crate) struct Object<T>(pub(crate) T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Fields<T> {
            type Value = T;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer
            .deserialize_map(Fields(std::marker::PhantomData))
            .map(Object)
    }
}

/// The `Last-Event-ID` header's number, if it has one; a typed 400 when
/// it is not a whole number (`what` names the ids it should be).
fn last_event_id(headers: &HeaderMap, what: &str) -> Result<Option<u64>, ApiError> {
    headers
        .get("last-event-id")
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorType::InvalidRequest,
                        format!("Last-Event-ID must be {what} (a whole number)"),
                    )
                })
        })
        .transpose()
}
