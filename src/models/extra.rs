//! The fields of a configuration object that nnx does not read. They are kept, within a bound,
//! so that a configuration read and written again loses none of them; the fields nnx reads are
//! parsed into their types as they come, and nothing is buffered on the way. (`serde`'s
//! `flatten` buffers every field of the object as a generic value first, so that a small file of
//! millions of tiny nested values took gigabytes.)

use std::cell::Cell;
use std::marker::PhantomData;

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// The most memory, as estimated, that the fields one configuration object keeps may take.
/// Published configurations keep a few KiB (a classifier's label maps a few MiB); a value past
/// this is not a configuration.
pub(crate) const KEPT_BYTES: usize = 16 << 20;

/// The estimated cost of one array element (its value and the array's spare room).
const ELEMENT: usize = 64;
/// The estimated cost of one object entry beyond its key's text (key, value, map node share).
const ENTRY: usize = 96;
/// The estimated cost of an object's first map node.
const OBJECT: usize = 640;

/// A configuration type whose own fields come from its derived deserializer (`#[serde(remote =
/// "Self")]`, which derives it as an inherent function) and whose other fields are kept in
/// `extra`.
pub(crate) trait KeepsExtra: Sized {
    /// The derived deserializer of the fields the type reads.
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;

    /// Where the other fields go.
    fn extra(&mut self) -> &mut Map<String, Value>;
}

/// Implements `Deserialize` (the type's fields through its derived deserializer, the other
/// fields kept within [`KEPT_BYTES`]) and `Serialize` (the derived one) for a configuration
/// type declared with `#[serde(remote = "Self")]` and a field
/// `#[serde(flatten, skip_deserializing)] extra: serde_json::Map<String, serde_json::Value>`.
macro_rules! keeps_extra {
    ($type:ident) => {
        impl $crate::models::extra::KeepsExtra for $type {
            fn read<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                $type::deserialize(deserializer)
            }

            fn extra(&mut self) -> &mut serde_json::Map<String, serde_json::Value> {
                &mut self.extra
            }
        }

        impl<'de> serde::Deserialize<'de> for $type {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                $crate::models::extra::deserialize(deserializer)
            }
        }

        impl serde::Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                $type::serialize(self, serializer)
            }
        }
    };
}
pub(crate) use keeps_extra;

/// Deserializes `T` from an object: the fields `T` reads as they come, every other one kept in
/// its `extra` while the estimate of what they take stays within [`KEPT_BYTES`].
///
/// # Errors
/// The deserializer's error for anything but an object, a field of the wrong type, or kept
/// fields past the bound (naming the field).
pub(crate) fn deserialize<'de, D: Deserializer<'de>, T: KeepsExtra>(deserializer: D) -> Result<T, D::Error> {
    deserializer.deserialize_map(Split::<T>(PhantomData))
}

/// The field names `T`'s derived deserializer reads: it hands them to `deserialize_struct`.
fn field_names<T: KeepsExtra>() -> &'static [&'static str] {
    let names = Cell::new(&[][..]);
    let _ = T::read(FieldNames(&names));
    names.get()
}

struct Split<T>(PhantomData<T>);

impl<'de, T: KeepsExtra> Visitor<'de> for Split<T> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a configuration object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        let mut extra = Map::new();
        let mut fields = Fields { map, known: field_names::<T>(), extra: &mut extra, budget: KEPT_BYTES };
        let mut value = T::read(de::value::MapAccessDeserializer::new(&mut fields))?;
        *value.extra() = extra;
        Ok(value)
    }
}

/// The entries of an object as the derived deserializer sees them: only the fields it reads;
/// the others are kept aside on the way.
struct Fields<'a, A> {
    map: A,
    known: &'static [&'static str],
    extra: &'a mut Map<String, Value>,
    budget: usize,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Fields<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(key) = self.map.next_key::<String>()? else { return Ok(None) };
            if self.known.contains(&key.as_str()) {
                return seed.deserialize(key.into_deserializer()).map(Some);
            }
            let mut kept = Kept { key: &key, budget: &mut self.budget };
            kept.charge(key.len() + ENTRY)?;
            let value = self.map.next_value_seed(kept)?;
            self.extra.insert(key, value);
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// One kept value, built while the budget lasts.
struct Kept<'b> {
    /// The top-level field it is under, for the error.
    key: &'b str,
    budget: &'b mut usize,
}

impl Kept<'_> {
    fn charge<E: de::Error>(&mut self, bytes: usize) -> Result<(), E> {
        match self.budget.checked_sub(bytes) {
            Some(left) => {
                *self.budget = left;
                Ok(())
            }
            None => Err(E::custom(format_args!(
                "the field `{}`, which nnx does not read, holds more than {} MiB of values (nnx keeps such \
                 fields only to write them back): remove it",
                self.key,
                KEPT_BYTES >> 20
            ))),
        }
    }

    fn inner(&mut self) -> Kept<'_> {
        Kept { key: self.key, budget: self.budget }
    }
}

impl<'de> DeserializeSeed<'de> for Kept<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Kept<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(mut self, value: &str) -> Result<Value, E> {
        self.charge(value.len())?;
        Ok(Value::String(value.to_owned()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<S: SeqAccess<'de>>(mut self, mut seq: S) -> Result<Value, S::Error> {
        let mut items = Vec::new();
        loop {
            self.charge(ELEMENT)?;
            match seq.next_element_seed(self.inner())? {
                Some(item) => items.push(item),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<M: MapAccess<'de>>(mut self, mut map: M) -> Result<Value, M::Error> {
        self.charge(OBJECT)?;
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            self.charge(key.len() + ENTRY)?;
            let value = map.next_value_seed(self.inner())?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// A deserializer that only records the field names a derived struct deserializer asks for.
struct FieldNames<'a>(&'a Cell<&'static [&'static str]>);

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("only the field names are asked for"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.set(fields);
        Err(de::Error::custom("only the field names are asked for"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(remote = "Self")]
    struct Sample {
        width: usize,
        #[serde(default, rename = "type")]
        kind: Option<String>,
        #[serde(flatten, skip_deserializing)]
        extra: Map<String, Value>,
    }

    keeps_extra!(Sample);

    #[test]
    fn read_fields_are_typed_and_the_others_kept_in_order() {
        let text = r#"{"zeta": [1, {"a": null}], "width": 3, "type": "x", "alpha": "kept"}"#;
        let sample: Sample = serde_json::from_str(text).unwrap();
        assert_eq!((sample.width, sample.kind.as_deref()), (3, Some("x")));
        assert_eq!(Value::Object(sample.extra.clone()), serde_json::json!({"zeta": [1, {"a": null}], "alpha": "kept"}));
        let written = serde_json::to_value(&sample).unwrap();
        assert_eq!(written, serde_json::json!({"width": 3, "type": "x", "zeta": [1, {"a": null}], "alpha": "kept"}));
        let error = serde_json::from_str::<Sample>(r#"{"width": "wide"}"#).unwrap_err().to_string();
        assert!(error.contains("expected usize"), "{error}");
    }

    #[test]
    fn kept_fields_past_the_bound_are_refused_by_name() {
        let mut text = String::from(r#"{"width": 1, "noise": ["#);
        text.push_str(&vec!["{}"; KEPT_BYTES / OBJECT + 1].join(","));
        text.push_str("]}");
        let error = serde_json::from_str::<Sample>(&text).unwrap_err().to_string();
        assert!(error.contains("`noise`") && error.contains("remove it"), "{error}");
    }
}
