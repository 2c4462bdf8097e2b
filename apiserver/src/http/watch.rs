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
            && t.selectors.labels.is_empty()
            && t.selectors.fields.is_empty()
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
                if !self.visible.remove(raw.key())
                    && !obj.as_ref().is_none_or(|o| self.target.selectors.matches(o))
                {
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
