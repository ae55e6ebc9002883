//! JSON as written, for tests that pin an output's shape.

use serde::de::{IgnoredAny, MapAccess, Visitor};

/// The keys of a JSON object, in the order they are written (a `Value` would
/// sort them).
pub fn keys_in_order(json: &str) -> Result<Vec<String>, serde_json::Error> {
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<String>, A::Error> {
            let mut keys = Vec::new();
            while let Some((key, IgnoredAny)) = map.next_entry::<String, IgnoredAny>()? {
                keys.push(key);
            }
            Ok(keys)
        }
    }
    serde::Deserializer::deserialize_map(&mut serde_json::Deserializer::from_str(json), Keys)
}
