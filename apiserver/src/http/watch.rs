//! Watch over HTTP: newline-delimited JSON events, flushed one by one, with selector
//! transitions (an object that starts or stops matching becomes ADDED or DELETED for this
//! watcher), Table and PartialObjectMetadata encodings, bookmarks, and a final ERROR event.

use std::collections::HashSet;
use std::convert::Infallible;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use super::error::ApiError;
use super::negotiate::Output;
use super::resource::{WatchTarget, convert_for_watch, storage_error};
use super::table;
use crate::storage::{RawObject, Storage, StorageError, WatchEvent};

/// One event line: an object to encode, or the finished line of an object sent as stored.
enum Line {
    Json(&'static str, Value),
    Verbatim(bytes::Bytes),
}

/// Gives a key set's table back once most of its keys are gone (a `HashSet` never shrinks on
/// its own); after a shrink the set is full again, so removals stay amortized O(1).
fn shrink_when_sparse(keys: &mut HashSet<String>) {
    if keys.capacity() > 64 && keys.len() < keys.capacity() / 4 {
        keys.shrink_to_fit();
    }
}

/// Per-watch state for turning storage events into what this client should see.
struct Encoder {
    target: WatchTarget,
    /// Keys (`ns/name`) of objects this watcher currently sees.
    visible: HashSet<String>,
    /// Keys this watcher has sent an event for (so it knows whether the client sees them).
    known: HashSet<String>,
    /// Whether the watch began with the whole current state (resourceVersion unset or 0, or
    /// sendInitialEvents): then every visible object is in `visible`.
    complete: bool,
    /// Table columns go only into the first Table event.
    columns_sent: bool,
    done: bool,
}

impl Encoder {
    /// The object decoded, or `None` when it goes out as stored (JSON of the storage version
    /// and no selector to evaluate): then it is spliced, not decoded and encoded again.
    fn decode_unless_verbatim(&self, raw: &RawObject) -> Result<Option<Value>, ApiError> {
        let t = &self.target;
        if t.output == Output::Json
            && t.version == t.kind.info().storage_version
            && t.selectors.select_all()
            && raw.servable()
        {
            return Ok(None);
        }
        raw.decode().map(Some).map_err(|e| storage_error(e, ""))
    }

    /// The event line of an object sent as stored.
    fn verbatim_line(kind: &str, raw: &RawObject) -> Result<bytes::Bytes, ApiError> {
        let mut line = Vec::with_capacity(64);
        line.extend_from_slice(b"{\"type\":\"");
        line.extend_from_slice(kind.as_bytes());
        line.extend_from_slice(b"\",\"object\":");
        raw.write_json(&mut line).map_err(|e| storage_error(e, ""))?;
        line.extend_from_slice(b"}\n");
        Ok(bytes::Bytes::from(line))
    }

    fn encode_object(&mut self, obj: Value) -> Result<Value, ApiError> {
        let obj = convert_for_watch(self.target.kind, obj, &self.target.version)?;
        Ok(match self.target.output {
            Output::Json | Output::Yaml => obj,
            Output::Metadata => table::partial_metadata(&obj),
            Output::Table(v) => {
                let rv = obj["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let with_columns = !self.columns_sent;
                self.columns_sent = true;
                table::table_of(
                    self.target.kind,
                    v,
                    std::slice::from_ref(&obj),
                    &rv,
                    None,
                    self.target.include,
                    with_columns,
                )
            }
        })
    }

    /// A bookmark's object in the representation this watch negotiated, as kube-apiserver
    /// transforms it like any event's: the watched kind in the requested version, or a
    /// `PartialObjectMetadata` for a metadata-only watch (client-go's metadata client, which the
    /// garbage collector and namespace controller use, decodes nothing else and would end the
    /// watch on every bookmark), or a Table without rows.
    fn bookmark_object(&self, meta: Value) -> Value {
        match self.target.output {
            Output::Json | Output::Yaml => json!({
                "kind": self.target.kind.info().kind,
                "apiVersion": self.target.kind.api_version(&self.target.version),
                "metadata": meta,
            }),
            Output::Metadata => table::partial_metadata(&json!({ "metadata": meta })),
            Output::Table(v) => json!({
                "kind": "Table",
                "apiVersion": format!("meta.k8s.io/{v}"),
                "metadata": meta,
                "rows": [],
            }),
        }
    }

    fn line(kind: &str, object: Value) -> Option<bytes::Bytes> {
        let mut line = json!({"type": kind, "object": object}).to_string().into_bytes();
        line.push(b'\n');
        Some(bytes::Bytes::from(line))
    }

    /// The line for one storage event, if this watcher should see one.
    fn event(&mut self, event: WatchEvent<RawObject>) -> Option<bytes::Bytes> {
        if self.done {
            return None;
        }
        let is_added = matches!(event, WatchEvent::Added(_));
        let result = match event {
            WatchEvent::Added(raw) | WatchEvent::Modified(raw) => 'event: {
                let created = is_added;
                let k = raw.key().to_owned();
                let obj = match self.decode_unless_verbatim(&raw) {
                    Ok(obj) => obj,
                    Err(e) => break 'event Err(e),
                };
                if self.target.selectors.select_all() {
                    // Every object matches: the client sees what was created or sent, so a
                    // creation is ADDED and any other change MODIFIED, with no key to remember
                    // (a watch of 10,000 objects kept 10,000 keys, for ever after their deletes).
                    let kind = if created { "ADDED" } else { "MODIFIED" };
                    break 'event match obj {
                        None => Self::verbatim_line(kind, &raw).map(Line::Verbatim),
                        Some(obj) => self.encode_object(obj).map(|o| Line::Json(kind, o)),
                    };
                }
                let matches = obj.as_ref().is_none_or(|o| self.target.selectors.matches(o));
                let was_visible = self.visible.contains(&k);
                // Whether this watcher knows if the client sees the object: it does when the
                // watch began with the whole state, or it has sent an event for it since. A
                // watch from a resourceVersion does not know what matched before it began: a
                // change is then MODIFIED when it matches and DELETED when it does not (a
                // DELETED of an object the client never had is a no-op for informers; a
                // missing one would leave a stale object in their caches).
                let known = self.complete || created || !self.known.insert(k.clone());
                let kind = match (matches, was_visible, known) {
                    (true, true, _) => "MODIFIED",
                    (true, false, true) => "ADDED",
                    (true, false, false) => "MODIFIED",
                    (false, true, _) | (false, false, false) => "DELETED",
                    (false, false, true) => return None,
                };
                if matches {
                    self.visible.insert(k);
                } else {
                    self.visible.remove(&k);
                }
                match obj {
                    None => Self::verbatim_line(kind, &raw).map(Line::Verbatim),
                    Some(obj) => self.encode_object(obj).map(|o| Line::Json(kind, o)),
                }
            }
            WatchEvent::Deleted(raw) => 'event: {
                let obj = match self.decode_unless_verbatim(&raw) {
                    Ok(obj) => obj,
                    Err(e) => break 'event Err(e),
                };
                // Gone: a key comes back only with a creation, which the client is told of.
                let was_visible = self.visible.remove(raw.key());
                self.known.remove(raw.key());
                shrink_when_sparse(&mut self.visible);
                shrink_when_sparse(&mut self.known);
                if !was_visible && !obj.as_ref().is_none_or(|o| self.target.selectors.matches(o)) {
                    return None;
                }
                match obj {
                    None => Self::verbatim_line("DELETED", &raw).map(Line::Verbatim),
                    Some(obj) => self.encode_object(obj).map(|o| Line::Json("DELETED", o)),
                }
            }
            WatchEvent::Bookmark {
                resource_version,
                initial_events_end,
            } => {
                let mut meta = json!({"resourceVersion": resource_version.to_string()});
                if initial_events_end {
                    meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                }
                Ok(Line::Json("BOOKMARK", self.bookmark_object(meta)))
            }
            WatchEvent::Error(e) => Err(storage_error(e, "")),
        };
        match result {
            Ok(Line::Json(kind, object)) => Self::line(kind, object),
            Ok(Line::Verbatim(line)) => Some(line),
            Err(e) => {
                self.done = true;
                Self::line("ERROR", e.to_status())
            }
        }
    }
}

/// Starts a watch; errors before streaming (a too-old resourceVersion) are plain responses.
pub fn serve(storage: &Storage, target: &WatchTarget) -> Result<Response, ApiError> {
    let stream = match storage.watch_raw(&target.options) {
        Ok(stream) => stream,
        // As kube-apiserver's watch cache: once the request is authorized and its
        // resourceVersion parsed, a too-old (or too-new) resourceVersion is an ERROR event in a
        // 200 stream, which is what makes clients relist (a plain 410 makes kube-runtime retry
        // the same resourceVersion forever).
        Err(e @ (StorageError::Expired { .. } | StorageError::TooLargeResourceVersion { .. })) => {
            let line = Encoder::line("ERROR", storage_error(e, "").to_status());
            let body = Body::from_stream(futures::stream::iter(line.map(Ok::<_, Infallible>)));
            let mut response = (StatusCode::OK, body).into_response();
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            return Ok(response);
        }
        Err(e) => return Err(storage_error(e, "")),
    };
    let timeout = target.timeout;
    let mut encoder = Encoder {
        target: target.clone(),
        visible: HashSet::new(),
        known: HashSet::new(),
        complete: target.options.send_initial_events
            || target
                .options
                .resource_version
                .as_deref()
                .is_none_or(|rv| rv.is_empty() || rv == "0"),
        columns_sent: false,
        done: false,
    };
    let lines = stream
        .take_until(tokio::time::sleep(timeout))
        .scan((), move |_, event| {
            let done_before = encoder.done;
            let line = encoder.event(event);
            // Stop after the ERROR event.
            futures::future::ready(if done_before { None } else { Some(line) })
        })
        .filter_map(futures::future::ready)
        .map(Ok::<_, Infallible>);
    let mut response = (StatusCode::OK, Body::from_stream(lines)).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::http::resource::Selectors;
    use crate::http::selectors::{FieldSelector, LabelSelector};
    use crate::http::table::IncludeObject;
    use crate::registry::kind::Kind;
    use crate::storage::RawObject;

    /// A watch from resourceVersion 5 (so it does not know what the client saw before it).
    fn encoder(labels: &str) -> Encoder {
        Encoder {
            target: WatchTarget {
                kind: Kind::CLUSTER,
                version: "v1alpha2".into(),
                options: crate::storage::WatchOptions {
                    namespace: None,
                    resource_version: Some("5".into()),
                    send_initial_events: false,
                    allow_bookmarks: false,
                },
                selectors: Selectors {
                    labels: LabelSelector::parse(labels).unwrap(),
                    fields: FieldSelector::default(),
                },
                output: Output::Json,
                include: IncludeObject::None,
                timeout: std::time::Duration::from_secs(60),
            },
            visible: HashSet::new(),
            known: HashSet::new(),
            complete: false,
            columns_sent: false,
            done: false,
        }
    }

    fn object(name: &str, tier: Option<&str>, rev: u64) -> RawObject {
        let labels = tier
            .map(|t| format!(",\"labels\":{{\"tier\":\"{t}\"}}"))
            .unwrap_or_default();
        RawObject::for_test(
            &format!("ns/{name}"),
            &format!(
                "{{\"apiVersion\":\"etcd.operator.dev/v1alpha2\",\"kind\":\"EtcdCluster\",\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"ns\"{labels}}},\"spec\":{{\"replicas\":3}}}}"
            ),
            rev,
        )
    }

    fn kind_of(line: Option<bytes::Bytes>) -> Option<String> {
        let line: Value = serde_json::from_slice(&line?).unwrap();
        Some(line["type"].as_str().unwrap().to_string())
    }

    #[test]
    fn a_watch_without_selectors_remembers_no_keys() {
        let mut e = encoder("");
        let kinds: Vec<_> = [
            WatchEvent::Modified(object("a", None, 6)),
            WatchEvent::Added(object("b", None, 7)),
            WatchEvent::Modified(object("b", None, 8)),
            WatchEvent::Deleted(object("a", None, 9)),
            WatchEvent::Deleted(object("b", None, 10)),
        ]
        .into_iter()
        .map(|ev| kind_of(e.event(ev)))
        .collect();
        let kinds: Vec<_> = kinds.iter().map(|k| k.as_deref()).collect();
        assert_eq!(
            kinds,
            [
                Some("MODIFIED"),
                Some("ADDED"),
                Some("MODIFIED"),
                Some("DELETED"),
                Some("DELETED")
            ]
        );
        assert!(e.visible.is_empty() && e.known.is_empty());
    }

    #[test]
    fn a_selecting_watch_tells_entries_and_exits_and_forgets_deleted_keys() {
        let mut e = encoder("tier=x");
        let mut next = |ev| kind_of(e.event(ev));
        // Unknown before the watch: a match is MODIFIED, a non-match DELETED (a no-op for a
        // client that never had it).
        assert_eq!(
            next(WatchEvent::Modified(object("a", Some("x"), 6))).as_deref(),
            Some("MODIFIED")
        );
        assert_eq!(
            next(WatchEvent::Modified(object("c", None, 7))).as_deref(),
            Some("DELETED")
        );
        // Leaving the selection is DELETED once, coming back ADDED.
        assert_eq!(
            next(WatchEvent::Modified(object("a", None, 8))).as_deref(),
            Some("DELETED")
        );
        assert_eq!(next(WatchEvent::Modified(object("a", None, 9))), None);
        assert_eq!(
            next(WatchEvent::Modified(object("a", Some("x"), 10))).as_deref(),
            Some("ADDED")
        );
        assert_eq!(
            next(WatchEvent::Deleted(object("a", Some("x"), 11))).as_deref(),
            Some("DELETED")
        );
        assert_eq!(next(WatchEvent::Deleted(object("c", None, 12))), None);
        // Re-created, it is new to the client again.
        assert_eq!(
            next(WatchEvent::Added(object("a", Some("x"), 13))).as_deref(),
            Some("ADDED")
        );
        assert_eq!(
            next(WatchEvent::Deleted(object("a", Some("x"), 14))).as_deref(),
            Some("DELETED")
        );
        assert!(e.visible.is_empty(), "{:?}", e.visible);
        assert!(e.known.is_empty(), "{:?}", e.known);
    }
}
