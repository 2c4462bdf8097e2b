//! A request body decoded into its typed object in one pass, noting what the typed object would
//! not keep: fields its type does not know (for `fieldValidation`) and arrays sent where it
//! wants an object (serde takes a struct as the sequence of its fields; kube-apiserver refuses
//! that as a type error). It replaces decoding, encoding the typed object again and comparing
//! the two trees, which cost a copy of the body, an encode and two walks per write. Pure.
//!
//! [`decode`] wraps serde_json's deserializer of a borrowed [`Value`]: every scalar, and every
//! error, is serde_json's own; objects and arrays are visited here so that each value knows its
//! path. A field the type does not know is skipped through `deserialize_ignored_any` (serde's
//! derive and k8s-openapi's hand-written impls both do that): that is where it is noted. Enum
//! payloads are left to serde_json whole (the API's enums are strings).

use std::cell::RefCell;

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeOwned, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A value's place in the body: `spec.members[0].name`.
#[derive(Debug, Clone, Copy)]
enum Path<'p> {
    Root,
    Key(&'p Path<'p>, &'p str),
    Index(&'p Path<'p>, usize),
}

impl Path<'_> {
    fn render(&self) -> String {
        match self {
            Path::Root => String::new(),
            Path::Key(Path::Root, key) => (*key).to_owned(),
            Path::Key(parent, key) => format!("{}.{key}", parent.render()),
            Path::Index(parent, index) => format!("{}[{index}]", parent.render()),
        }
    }
}

/// A container of one JSON type where the typed object has another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// Where, e.g. `spec.storage`.
    pub path: String,
    /// What the body has: `array` or `object`.
    pub actual: &'static str,
    /// What the type wants.
    pub expected: &'static str,
}

/// What the typed object does not keep of a body, in body order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Findings {
    /// Fields the type does not know, by path (a `null` one is no field).
    pub unknown: Vec<String>,
    /// Containers of the wrong JSON type that serde took anyway.
    pub mismatches: Vec<Mismatch>,
}

/// Decodes `value` as a `T` and says what `T` did not keep; the errors are serde_json's.
pub fn decode<T: DeserializeOwned>(value: &Value) -> Result<(T, Findings), serde_json::Error> {
    let findings = RefCell::new(Findings::default());
    let decoded = T::deserialize(Tracked {
        value,
        path: &Path::Root,
        findings: &findings,
    })?;
    Ok((decoded, findings.into_inner()))
}

/// A value of the body, with its path and where to note findings.
struct Tracked<'de, 'p> {
    value: &'de Value,
    path: &'p Path<'p>,
    findings: &'p RefCell<Findings>,
}

impl<'de, 'p> Tracked<'de, 'p> {
    fn mismatch(&self, actual: &'static str, expected: &'static str) {
        self.findings.borrow_mut().mismatches.push(Mismatch {
            path: self.path.render(),
            actual,
            expected,
        });
    }

    fn visit_object<V: Visitor<'de>>(
        &self,
        map: &'de Map<String, Value>,
        visitor: V,
    ) -> Result<V::Value, serde_json::Error> {
        let len = map.len();
        let mut access = TrackedMap {
            iter: map.iter(),
            pending: None,
            parent: self.path,
            findings: self.findings,
        };
        let value = visitor.visit_map(&mut access)?;
        // As serde_json: a visitor that stops early is an error.
        if access.iter.len() == 0 {
            Ok(value)
        } else {
            Err(de::Error::invalid_length(len, &"fewer elements in map"))
        }
    }

    fn visit_array<V: Visitor<'de>>(
        &self,
        array: &'de [Value],
        visitor: V,
    ) -> Result<V::Value, serde_json::Error> {
        let len = array.len();
        let mut access = TrackedSeq {
            iter: array.iter().enumerate(),
            parent: self.path,
            findings: self.findings,
        };
        let value = visitor.visit_seq(&mut access)?;
        if access.iter.len() == 0 {
            Ok(value)
        } else {
            Err(de::Error::invalid_length(len, &"fewer elements in array"))
        }
    }
}

/// Scalars (and their errors) are serde_json's own.
macro_rules! delegate {
    ($($method:ident),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
                self.value.$method(visitor)
            }
        )*
    };
}

impl<'de> Deserializer<'de> for Tracked<'de, '_> {
    type Error = serde_json::Error;

    delegate!(
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_unit,
        deserialize_identifier,
    );

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Object(map) => self.visit_object(map, visitor),
            Value::Array(array) => self.visit_array(array, visitor),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.value.deserialize_unit_struct(name, visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Array(array) => self.visit_array(array, visitor),
            Value::Object(_) => {
                self.mismatch("object", "array");
                self.value.deserialize_seq(visitor)
            }
            other => other.deserialize_seq(visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Object(map) => self.visit_object(map, visitor),
            other => other.deserialize_map(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Object(map) => self.visit_object(map, visitor),
            Value::Array(array) => {
                self.mismatch("array", "object");
                self.visit_array(array, visitor)
            }
            other => other.deserialize_struct(name, fields, visitor),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.value.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        if !self.value.is_null() {
            self.findings.borrow_mut().unknown.push(self.path.render());
        }
        visitor.visit_unit()
    }
}

/// An object's entries, each value with its key on its path.
struct TrackedMap<'de, 'p> {
    iter: serde_json::map::Iter<'de>,
    pending: Option<(&'de String, &'de Value)>,
    parent: &'p Path<'p>,
    findings: &'p RefCell<Findings>,
}

impl<'de> MapAccess<'de> for TrackedMap<'de, '_> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Self::Error> {
        match self.iter.next() {
            Some((key, value)) => {
                self.pending = Some((key, value));
                seed.deserialize(BorrowedStrDeserializer::new(key)).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Self::Error> {
        let Some((key, value)) = self.pending.take() else {
            return Err(de::Error::custom("value is missing"));
        };
        let path = Path::Key(self.parent, key);
        seed.deserialize(Tracked {
            value,
            path: &path,
            findings: self.findings,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

/// An array's items, each on its index's path.
struct TrackedSeq<'de, 'p> {
    iter: std::iter::Enumerate<std::slice::Iter<'de, Value>>,
    parent: &'p Path<'p>,
    findings: &'p RefCell<Findings>,
}

impl<'de> SeqAccess<'de> for TrackedSeq<'de, '_> {
    type Error = serde_json::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        match self.iter.next() {
            Some((index, value)) => {
                let path = Path::Index(self.parent, index);
                seed.deserialize(Tracked {
                    value,
                    path: &path,
                    findings: self.findings,
                })
                .map(Some)
            }
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_operator_api::{v1alpha1, v1alpha2};
    use serde_json::json;

    /// The way it was done before: decode, encode the typed object again, and walk both trees.
    /// Kept as the oracle the one-pass decode must agree with.
    mod round_trip {
        use serde_json::Value;

        pub(super) fn unknown(input: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
            match (input, typed) {
                (Value::Object(i), Value::Object(t)) => {
                    for (k, v) in i {
                        let child = if path.is_empty() {
                            k.clone()
                        } else {
                            format!("{path}.{k}")
                        };
                        match t.get(k) {
                            None if !v.is_null() => out.push(child),
                            Some(tv) => unknown(v, tv, &child, out),
                            None => {}
                        }
                    }
                }
                (Value::Array(i), Value::Array(t)) => {
                    for (idx, (iv, tv)) in i.iter().zip(t).enumerate() {
                        unknown(iv, tv, &format!("{path}[{idx}]"), out);
                    }
                }
                _ => {}
            }
        }

        pub(super) fn mismatches(
            input: &Value,
            typed: &Value,
            path: &str,
            out: &mut Vec<(String, &'static str)>,
        ) {
            match (input, typed) {
                (Value::Object(i), Value::Object(t)) => {
                    for (k, v) in i {
                        if let Some(tv) = t.get(k) {
                            let child = if path.is_empty() {
                                k.clone()
                            } else {
                                format!("{path}.{k}")
                            };
                            mismatches(v, tv, &child, out);
                        }
                    }
                }
                (Value::Array(i), Value::Array(t)) => {
                    for (idx, (iv, tv)) in i.iter().zip(t).enumerate() {
                        mismatches(iv, tv, &format!("{path}[{idx}]"), out);
                    }
                }
                (Value::Array(_), Value::Object(_)) => out.push((path.to_owned(), "array")),
                (Value::Object(_), Value::Array(_)) => out.push((path.to_owned(), "object")),
                _ => {}
            }
        }
    }

    /// Both ways on `input` as a `T`: same object, same errors, same findings.
    fn agree<T>(input: &Value) -> Option<Findings>
    where
        T: DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
    {
        let old: Result<T, _> = serde_json::from_value(input.clone());
        let new = decode::<T>(input);
        match (old, new) {
            (Ok(old), Ok((new, findings))) => {
                assert_eq!(new, old, "{input}");
                let typed = serde_json::to_value(&old).unwrap();
                let mut unknown = Vec::new();
                round_trip::unknown(input, &typed, "", &mut unknown);
                assert_eq!(findings.unknown, unknown, "{input}");
                let mut mismatches = Vec::new();
                round_trip::mismatches(input, &typed, "", &mut mismatches);
                let found: Vec<(String, &str)> = findings
                    .mismatches
                    .iter()
                    .map(|m| (m.path.clone(), m.actual))
                    .collect();
                assert_eq!(found, mismatches, "{input}");
                Some(findings)
            }
            (Err(old), Err(new)) => {
                assert_eq!(new.to_string(), old.to_string(), "{input}");
                None
            }
            (old, new) => panic!("the two ways disagree on {input}: {old:?} vs {new:?}"),
        }
    }

    fn v2(spec: Value) -> Value {
        json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
            "metadata": {"name": "a", "labels": {"x": "y"}}, "spec": spec})
    }

    #[test]
    fn unknown_fields_are_found_with_their_paths_as_the_round_trip_finds_them() {
        let mut body = v2(json!({
            "replicas": 3, "bogus": 1, "gone": null,
            "podTemplate": {"spec": {"tolerations": [{"key": "k", "extra": true}, {"key": "j"}],
                                     "containersX": []},
                            "metadata": {"labels": {"any": "key"}}},
            "storage": {"size": "1Gi", "nope": {"deep": 1}},
        }));
        body["metadata"]["unknownMeta"] = json!("x");
        body["topLevel"] = json!([1]);
        body["status"] = json!({"members": [{"name": "m", "weird": 1}]});
        let findings = agree::<v1alpha2::EtcdCluster>(&body).unwrap();
        assert_eq!(
            findings.unknown,
            [
                "metadata.unknownMeta",
                "spec.bogus",
                "spec.podTemplate.spec.containersX",
                "spec.podTemplate.spec.tolerations[0].extra",
                "spec.storage.nope",
                "status.members[0].weird",
                "topLevel",
            ]
        );
        assert!(findings.mismatches.is_empty());
        // The same body without them has nothing to say.
        let clean = v2(json!({"replicas": 3, "storage": {"size": "1Gi"}}));
        assert_eq!(agree::<v1alpha2::EtcdCluster>(&clean), Some(Findings::default()));
    }

    #[test]
    fn arrays_sent_for_objects_are_type_mismatches_as_the_round_trip_finds_them() {
        // serde takes a struct as the sequence of its fields: `storage` as [medium, size, ...].
        let body = v2(json!({"replicas": 3, "storage": []}));
        let findings = agree::<v1alpha2::EtcdCluster>(&body).unwrap();
        assert_eq!(
            findings.mismatches,
            [Mismatch {
                path: "spec.storage".into(),
                actual: "array",
                expected: "object"
            }]
        );
        let body = json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdCluster",
            "metadata": {"name": "a"}, "spec": [3, "3.5.1"]});
        let findings = agree::<v1alpha2::EtcdCluster>(&body).unwrap();
        assert_eq!(findings.mismatches.len(), 1);
        assert_eq!(findings.mismatches[0].path, "spec");
    }

    #[test]
    fn decode_errors_are_serde_jsons_own() {
        for spec in [
            json!({"replicas": "three"}),
            json!({"replicas": 3.5}),
            json!({"replicas": 1_u64 << 40}),
            json!({"paused": "yes"}),
            json!({"storage": {"storageClassName": 5}}),
            json!({"podTemplate": {"spec": {"tolerations": {"key": "k"}}}}),
            json!({"podTemplate": {"metadata": {"labels": ["x"]}}}),
            json!({"storage": ["Memory", "1Gi", "x", "y", "z", "extra", "more", "and more"]}),
            json!("not an object"),
            json!(null),
        ] {
            let body = v2(spec);
            assert!(agree::<v1alpha2::EtcdCluster>(&body).is_none(), "{body} decodes");
        }
        for body in [json!([1]), json!("x"), json!(3)] {
            assert!(agree::<v1alpha2::EtcdCluster>(&body).is_none(), "{body} decodes");
        }
    }

    #[test]
    fn both_versions_agree_with_the_round_trip_on_many_bodies() {
        let v1 = json!({"apiVersion": "etcd.operator.dev/v1alpha1", "kind": "EtcdCluster",
            "metadata": {"name": "a", "annotations": {"a": "b"}, "finalizers": ["f"]},
            "spec": {"size": 3, "version": "3.5.1", "unknown": {"x": 1},
                     "pod": {"labels": {"l": "v"}, "resources": {"limits": {"cpu": "1"}}, "odd": [1]},
                     "backup": {"backupIntervalInSecond": 60, "x": null}}});
        let findings = agree::<v1alpha1::EtcdCluster>(&v1).unwrap();
        assert!(
            findings.unknown.contains(&"spec.unknown".to_owned()),
            "{findings:?}"
        );
        assert!(
            findings.unknown.contains(&"spec.pod.odd".to_owned()),
            "{findings:?}"
        );
        let full = v2(json!({
            "replicas": 5, "version": "3.5.16", "paused": false,
            "podTemplate": {"metadata": {"labels": {"l": "v"}, "annotations": {"a": "b"}},
                            "spec": {"priorityClassName": "high", "nodeSelector": {"a": "b"},
                                     "affinity": {"podAntiAffinity": {}}, "tolerations": [{"key": "k", "operator": "Exists"}]}},
            "storage": {"size": "2Gi", "medium": "Disk", "storageClassName": "fast"},
            "backup": {"schedule": "0 * * * *", "retention": {"maxCount": 3},
                       "destination": {"s3": {"bucket": "b", "prefix": "p"}}},
            "maintenance": {"defragmentation": {"schedule": "0 3 * * *"}},
        }));
        assert_eq!(agree::<v1alpha2::EtcdCluster>(&full), Some(Findings::default()));
        let backup = json!({"apiVersion": "etcd.operator.dev/v1alpha2", "kind": "EtcdBackup",
            "metadata": {"name": "b"}, "spec": {"clusterName": "c", "more": 1}});
        let findings = agree::<etcd_operator_api::backup::EtcdBackup>(&backup).unwrap();
        assert_eq!(findings.unknown, ["spec.more"]);
        let event = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
            "involvedObject": {"kind": "Pod", "name": "p", "fieldPathX": "y"}, "count": 2,
            "eventTime": null, "reason": "R"});
        let findings = agree::<k8s_openapi::api::core::v1::Event>(&event).unwrap();
        assert_eq!(findings.unknown, ["involvedObject.fieldPathX"]);
    }
}
