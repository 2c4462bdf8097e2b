//! Stored objects served as bytes: the JSON written to etcd, with `metadata.resourceVersion`
//! spliced in, without decoding it into a `serde_json::Value` and encoding it again.
//!
//! Lists, gets and watch events of the storage version in JSON (what controllers and kubectl
//! ask for most) are then a memory copy per object instead of a parse and a serialization; a
//! 10,000-object list streams in chunks instead of being built in memory as one document.
//!
//! Where the splice goes is found once per stored object version (when it enters the watch
//! cache or comes from etcd), after checking that the bytes are one well-formed JSON object. An
//! object that is not (or whose metadata is not where expected, or already holds a
//! resourceVersion) is served through the decoding path, which reports what is wrong with it.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::cache::StoredObj;
use super::error::StorageError;

/// One stored object: its key relative to the prefix (`<namespace>/<name>`), its bytes and its
/// mod revision. Cheap to clone (shared bytes).
#[derive(Debug, Clone)]
pub struct RawObject {
    key: Arc<str>,
    stored: StoredObj,
}

impl RawObject {
    pub(crate) fn new(key: Arc<str>, stored: StoredObj) -> Self {
        Self { key, stored }
    }

    /// An object as the watch cache would hold it (for tests of what is built from events).
    #[cfg(test)]
    pub(crate) fn for_test(key: &str, json: &str, mod_rev: u64) -> Self {
        Self::new(
            Arc::from(key),
            StoredObj::new(Arc::from(json.as_bytes()), mod_rev),
        )
    }

    /// `<namespace>/<name>`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The object's resourceVersion (its etcd mod revision, or the revision of its deletion
    /// for the last state of a deleted object).
    pub fn resource_version(&self) -> u64 {
        self.stored.mod_rev
    }

    /// Whether [`RawObject::write_json`] can splice the stored bytes (no decode needed).
    pub fn servable(&self) -> bool {
        self.stored.splice.is_some()
    }

    /// The object as a JSON value, with `metadata.resourceVersion`.
    pub fn decode(&self) -> Result<Value, StorageError> {
        super::decode(&self.key, &self.stored.data, self.stored.mod_rev)
    }

    /// Appends the object's JSON, with `metadata.resourceVersion`, to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) -> Result<(), StorageError> {
        let data = &self.stored.data;
        match self.stored.splice {
            Some(at) => {
                let at = at as usize;
                let (head, tail) = data.split_at(at);
                out.reserve(data.len() + 32);
                out.extend_from_slice(head);
                out.extend_from_slice(b"\"resourceVersion\":\"");
                out.extend_from_slice(self.stored.mod_rev.to_string().as_bytes());
                out.push(b'"');
                if first_non_ws(tail) != Some(b'}') {
                    out.push(b',');
                }
                out.extend_from_slice(tail);
            }
            None => {
                let value = self.decode()?;
                serde_json::to_writer(out, &value).map_err(|e| StorageError::Encode {
                    key: self.key.to_string(),
                    reason: e.to_string(),
                })?;
            }
        }
        Ok(())
    }

    /// The object's JSON, with `metadata.resourceVersion`.
    pub fn to_json(&self) -> Result<Vec<u8>, StorageError> {
        let mut out = Vec::with_capacity(self.stored.data.len() + 32);
        self.write_json(&mut out)?;
        Ok(out)
    }
}

/// One page of a list, as stored bytes. See [`super::ListResult`] for the fields.
#[derive(Debug, Clone)]
pub struct RawListResult {
    /// Objects in key order.
    pub items: Vec<RawObject>,
    /// The revision of the snapshot the page was read from.
    pub resource_version: u64,
    /// Set when more items follow.
    pub continue_token: Option<String>,
    /// How many items follow this page (only when paging).
    pub remaining_item_count: Option<i64>,
}

impl RawListResult {
    /// Decodes every item.
    pub fn decode(self) -> Result<super::ListResult, StorageError> {
        let items = self
            .items
            .iter()
            .map(RawObject::decode)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(super::ListResult {
            items,
            resource_version: self.resource_version,
            continue_token: self.continue_token,
            remaining_item_count: self.remaining_item_count,
        })
    }

    /// Whether every item can be served without decoding.
    pub fn servable(&self) -> bool {
        self.items.iter().all(RawObject::servable)
    }
}

/// Size of the chunks a streamed JSON list is cut into.
const CHUNK_BYTES: usize = 64 * 1024;

/// A JSON list body in chunks of about 64 KiB, produced as the consumer asks for them:
/// `head`, then the items separated by commas, then `tail`. Items that cannot be spliced are
/// decoded and encoded; check [`RawListResult::servable`] first to avoid a failure mid-stream
/// (a failing item ends the body early, which clients see as a truncated response).
#[derive(Debug)]
pub struct JsonListChunks {
    head: Option<Vec<u8>>,
    items: std::vec::IntoIter<RawObject>,
    first: bool,
    tail: Option<Vec<u8>>,
}

impl JsonListChunks {
    /// `head` must end where the first item starts (e.g. with `"items":[`); `tail` closes it.
    pub fn new(head: Vec<u8>, items: Vec<RawObject>, tail: Vec<u8>) -> Self {
        Self {
            head: Some(head),
            items: items.into_iter(),
            first: true,
            tail: Some(tail),
        }
    }
}

impl Iterator for JsonListChunks {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let mut buf = self.head.take().unwrap_or_default();
        buf.reserve(CHUNK_BYTES);
        while buf.len() < CHUNK_BYTES {
            let Some(item) = self.items.next() else {
                if let Some(tail) = self.tail.take() {
                    buf.extend_from_slice(&tail);
                }
                break;
            };
            if !self.first {
                buf.push(b',');
            }
            self.first = false;
            if let Err(error) = item.write_json(&mut buf) {
                tracing::error!(error = %etcd_operator_api::report::Chain(&error), key = item.key(), "encode a stored object for a list; ending the response");
                self.items = Vec::new().into_iter();
                self.tail = None;
                break;
            }
        }
        (!buf.is_empty()).then(|| Bytes::from(buf))
    }
}

fn first_non_ws(bytes: &[u8]) -> Option<u8> {
    bytes.iter().copied().find(|b| !b.is_ascii_whitespace())
}

/// Where `"resourceVersion":"N"` goes in a stored object: just after the `{` that opens the value
/// of its top-level `metadata` key. `None` when the bytes are not one well-formed JSON object,
/// have no object under `metadata` (or more than one `metadata` key), or already hold
/// `metadata.resourceVersion`: such objects take the decoding path.
pub(crate) fn splice_point(data: &[u8]) -> Option<u32> {
    // Well-formed JSON, nothing after it: the scan below may then skip values without checking.
    serde_json::from_slice::<serde::de::IgnoredAny>(data).ok()?;
    let mut found = None;
    let mut seen_resource_version = false;
    for_each_member(data, skip_ws(data, 0)?, &mut |key, value_at| {
        if key != b"metadata" {
            return true;
        }
        if found.is_some() || data.get(value_at) != Some(&b'{') {
            return false;
        }
        found = Some(value_at + 1);
        for_each_member(data, value_at, &mut |k, _| {
            seen_resource_version |= k == b"resourceVersion";
            true
        })
        .is_some()
    })?;
    if seen_resource_version {
        return None;
    }
    u32::try_from(found?).ok()
}

/// Calls `f(raw key bytes, index of the value)` for each member of the JSON object starting at
/// `at` (which must be `{`) until `f` returns false; returns the index after the object, `None`
/// when `f` stopped or the bytes are not as expected. Assumes well-formed JSON.
fn for_each_member(data: &[u8], at: usize, f: &mut dyn FnMut(&[u8], usize) -> bool) -> Option<usize> {
    if data.get(at) != Some(&b'{') {
        return None;
    }
    let mut i = skip_ws(data, at + 1)?;
    if data.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        let key_end = string_end(data, i)?;
        let key = data.get(i + 1..key_end - 1)?;
        i = skip_ws(data, key_end)?;
        if data.get(i) != Some(&b':') {
            return None;
        }
        let value_at = skip_ws(data, i + 1)?;
        if !f(key, value_at) {
            return None;
        }
        i = skip_ws(data, value_end(data, value_at)?)?;
        match data.get(i) {
            Some(b',') => i = skip_ws(data, i + 1)?,
            Some(b'}') => return Some(i + 1),
            _ => return None,
        }
    }
}

fn skip_ws(data: &[u8], mut i: usize) -> Option<usize> {
    while data.get(i)?.is_ascii_whitespace() {
        i += 1;
    }
    Some(i)
}

/// The index after the string starting at `at` (which must be `"`).
fn string_end(data: &[u8], at: usize) -> Option<usize> {
    if data.get(at) != Some(&b'"') {
        return None;
    }
    let mut i = at + 1;
    loop {
        match data.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// The index after the JSON value starting at `at`.
fn value_end(data: &[u8], at: usize) -> Option<usize> {
    match data.get(at)? {
        b'"' => string_end(data, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match data.get(i)? {
                    b'"' => {
                        i = string_end(data, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let mut i = at;
            while let Some(b) = data.get(i) {
                if matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace() {
                    break;
                }
                i += 1;
            }
            Some(i)
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn raw(data: &[u8], rev: u64) -> RawObject {
        RawObject::new(Arc::from("ns/name"), StoredObj::new(Arc::from(data), rev))
    }

    /// The spliced bytes parse to exactly what decoding gives.
    fn assert_same_as_decoded(data: &[u8]) {
        let obj = raw(data, 42);
        let decoded = obj.decode().unwrap();
        let spliced: Value = serde_json::from_slice(&obj.to_json().unwrap()).unwrap();
        assert_eq!(spliced, decoded, "for {}", String::from_utf8_lossy(data));
    }

    #[test]
    fn splices_resource_version_into_top_level_metadata() {
        let v = json!({
            "apiVersion": "etcd.operator.dev/v1alpha2",
            "kind": "EtcdCluster",
            "metadata": {"name": "a", "namespace": "ns", "annotations": {"x": "{\"metadata\":{}}"}},
            "spec": {"podTemplate": {"metadata": {"labels": {"a": "b"}}}, "replicas": 3},
            "status": {"members": [{"name": "m\"}]"}], "x": [1, 2.5e3, true, null]},
        });
        let data = serde_json::to_vec(&v).unwrap();
        let obj = raw(&data, 7);
        assert!(obj.servable());
        let out: Value = serde_json::from_slice(&obj.to_json().unwrap()).unwrap();
        let mut expected = v.clone();
        expected["metadata"]["resourceVersion"] = json!("7");
        assert_eq!(out, expected);
        assert_same_as_decoded(&data);
        // Pretty-printed (whitespace everywhere) works the same.
        assert_same_as_decoded(&serde_json::to_vec_pretty(&v).unwrap());
    }

    #[test]
    fn empty_metadata_and_metadata_last() {
        for data in [
            br#"{"kind":"X","metadata":{}}"#.as_slice(),
            br#"{"metadata":{ },"kind":"X"}"#.as_slice(),
            br#"{"a":{"metadata":{"resourceVersion":"1"}},"metadata":{"name":"n"}}"#.as_slice(),
        ] {
            assert!(raw(data, 3).servable(), "{}", String::from_utf8_lossy(data));
            assert_same_as_decoded(data);
        }
    }

    #[test]
    fn odd_objects_take_the_decoding_path() {
        for data in [
            br#"{"kind":"X"}"#.as_slice(),
            br#"{"metadata":{"resourceVersion":"5","name":"n"}}"#.as_slice(),
            br#"{"metadata":null}"#.as_slice(),
            br#"{"metadata":{},"metadata":{}}"#.as_slice(),
            br#"{"metad\u0061ta":{"name":"n"}}"#.as_slice(),
        ] {
            assert!(!raw(data, 3).servable(), "{}", String::from_utf8_lossy(data));
            assert_same_as_decoded(data);
        }
        for bad in [
            br#"{"metadata":{}"#.as_slice(),
            br#"[1,2]"#.as_slice(),
            br#"{"metadata":{}} x"#.as_slice(),
            b"".as_slice(),
        ] {
            let obj = raw(bad, 3);
            assert!(!obj.servable());
            assert!(obj.to_json().is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn list_chunks_make_one_json_document() {
        let items: Vec<RawObject> = (0..3000)
            .map(|i| {
                let v = json!({"kind": "X", "metadata": {"name": format!("o{i}")}, "pad": "p".repeat(50)});
                raw(&serde_json::to_vec(&v).unwrap(), i)
            })
            .collect();
        let chunks: Vec<Bytes> =
            JsonListChunks::new(br#"{"kind":"XList","items":["#.to_vec(), items, b"]}".to_vec()).collect();
        assert!(chunks.len() > 1, "a 250 KB list comes in several chunks");
        let body: Vec<u8> = chunks.concat();
        let list: Value = serde_json::from_slice(&body).unwrap();
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), 3000);
        assert_eq!(items[2999]["metadata"]["resourceVersion"], json!("2999"));
        let empty: Vec<u8> = JsonListChunks::new(b"{\"items\":[".to_vec(), Vec::new(), b"]}".to_vec())
            .collect::<Vec<_>>()
            .concat();
        assert_eq!(
            serde_json::from_slice::<Value>(&empty).unwrap(),
            json!({"items": []})
        );
    }
}
