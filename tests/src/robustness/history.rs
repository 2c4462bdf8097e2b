//! The recorded client load: a few clients put unique values, read and compare-and-swap on a
//! small keyset, each operation recorded with its call and return times (no return time when no
//! answer came); the history split per key into the checker's register operations.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use rand::{Rng, SeedableRng};

use super::linearizability::{self, Operation, Register, RegisterInput, RegisterOutput, Value, Verdict};

/// Every key the load touches starts with this.
pub const KEY_PREFIX: &str = "robust/";

/// What a client asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Put a value no other operation puts.
    Put { value: String },
    /// A linearizable read.
    Get,
    /// A transaction: if the key holds `expect` (`None`: does not exist), put `new`.
    CompareAndSwap { expect: Option<String>, new: String },
}

/// What it was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// The put was acknowledged at `revision`.
    Put { revision: i64 },
    /// The value read, at the revision of the read.
    Get { value: Option<String>, revision: i64 },
    /// Whether the comparison held; the revision of the transaction.
    CompareAndSwap { swapped: bool, revision: i64 },
    /// No answer (an error or a timeout): it may or may not have taken effect.
    Failed { error: String },
}

/// One operation as a client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The client (one operation in flight per client).
    pub client: usize,
    /// The key.
    pub key: String,
    /// What was asked.
    pub request: Request,
    /// What was answered.
    pub response: Response,
    /// When it was called, since the load began.
    pub call: Duration,
    /// When the answer came; `None` for [`Response::Failed`].
    pub ret: Option<Duration>,
}

/// A write etcd acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckedWrite {
    /// The key.
    pub key: String,
    /// The value.
    pub value: String,
    /// The revision etcd answered.
    pub revision: i64,
}

/// Every operation of a run.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// In the order they were recorded (per client, in call order).
    pub ops: Vec<Recorded>,
}

/// A checker operation on one key.
pub type RegisterOp = Operation<RegisterInput, RegisterOutput>;

/// One key's history: as the checker takes it, and as recorded (same order, same length).
#[derive(Debug, Clone, Default)]
pub struct KeyHistory {
    /// The register operations.
    pub ops: Vec<RegisterOp>,
    /// The recorded operations they come from.
    pub recorded: Vec<Recorded>,
}

/// The checker's answer for one key.
#[derive(Debug, Clone)]
pub struct KeyVerdict {
    /// The key.
    pub key: String,
    /// Operations checked (failed reads left out: they constrain nothing).
    pub operations: usize,
    /// The verdict.
    pub verdict: Verdict,
    /// The operations of the key as checked, to explain a violation.
    pub checked: Vec<Recorded>,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl History {
    /// Writes etcd acknowledged: puts, and compare-and-swaps whose comparison held.
    pub fn acknowledged_writes(&self) -> Vec<AckedWrite> {
        self.ops
            .iter()
            .filter_map(|op| match (&op.request, &op.response) {
                (Request::Put { value }, Response::Put { revision })
                | (
                    Request::CompareAndSwap { new: value, .. },
                    Response::CompareAndSwap {
                        swapped: true,
                        revision,
                    },
                ) => Some(AckedWrite {
                    key: op.key.clone(),
                    value: value.clone(),
                    revision: *revision,
                }),
                _ => None,
            })
            .collect()
    }

    /// Every (key, value) some operation tried to write, acknowledged or not.
    pub fn attempted_writes(&self) -> std::collections::HashSet<(&str, &str)> {
        self.ops
            .iter()
            .filter_map(|op| match &op.request {
                Request::Put { value } | Request::CompareAndSwap { new: value, .. } => {
                    Some((op.key.as_str(), value.as_str()))
                }
                Request::Get => None,
            })
            .collect()
    }

    /// This history with each unknown outcome settled by the watch (as etcd's robustness tests
    /// patch theirs), for a checker that otherwise has to try every unknown write at every later
    /// point: a write whose value the watch never delivered did not happen (a put) or did not swap
    /// (a compare-and-swap) and is left out; one the watch delivered at revision `r` happened, and
    /// before the answer of any operation that observed a revision from `r` on (it becomes an
    /// acknowledged write answered then, or never if no operation did). Sound only with a
    /// complete watch, which the watch check verifies on its own.
    pub fn settled_by_watch(&self, events: &[super::watch::WatchedEvent]) -> History {
        let seen: HashMap<(&str, &str), i64> = events
            .iter()
            .filter(|e| e.put)
            .map(|e| ((e.key.as_str(), e.value.as_str()), e.revision))
            .collect();
        // (revision observed, answered at), and the earliest answer from each revision on.
        let mut observed: Vec<(i64, Duration)> = self
            .ops
            .iter()
            .filter_map(|op| {
                let revision = match op.response {
                    Response::Put { revision }
                    | Response::Get { revision, .. }
                    | Response::CompareAndSwap { revision, .. } => revision,
                    Response::Failed { .. } => return None,
                };
                Some((revision, op.ret?))
            })
            .collect();
        observed.sort_unstable();
        let mut earliest_from = vec![Duration::MAX; observed.len() + 1];
        for i in (0..observed.len()).rev() {
            earliest_from[i] = earliest_from[i + 1].min(observed[i].1);
        }
        let answered_by = |revision: i64| {
            let i = observed.partition_point(|(r, _)| *r < revision);
            Some(earliest_from[i]).filter(|d| *d != Duration::MAX)
        };
        let mut settled = History::default();
        for op in &self.ops {
            let written = match (&op.request, &op.response) {
                (
                    Request::Put { value } | Request::CompareAndSwap { new: value, .. },
                    Response::Failed { .. },
                ) => value,
                _ => {
                    settled.ops.push(op.clone());
                    continue;
                }
            };
            let Some(revision) = seen.get(&(op.key.as_str(), written.as_str())).copied() else {
                continue;
            };
            let response = match op.request {
                Request::CompareAndSwap { .. } => Response::CompareAndSwap {
                    swapped: true,
                    revision,
                },
                _ => Response::Put { revision },
            };
            let ret = answered_by(revision).map(|d| d.max(op.call));
            match ret {
                Some(ret) => settled.ops.push(Recorded {
                    response,
                    ret: Some(ret),
                    ..op.clone()
                }),
                // Nothing answered after it: it stays an unknown outcome.
                None => settled.ops.push(op.clone()),
            }
        }
        settled
    }

    /// Operations whose outcome is unknown.
    pub fn failed(&self) -> usize {
        self.ops
            .iter()
            .filter(|op| matches!(op.response, Response::Failed { .. }))
            .count()
    }

    /// The history of each key as register operations (values interned per key), with the
    /// recorded operations they came from. Failed reads are left out.
    pub fn per_key(&self) -> BTreeMap<String, KeyHistory> {
        let mut keys: BTreeMap<String, KeyHistory> = BTreeMap::new();
        let mut ids: HashMap<(String, String), Value> = HashMap::new();
        let mut intern = |key: &str, value: &str| -> Value {
            let next = Value::try_from(ids.len()).unwrap_or(Value::MAX);
            *ids.entry((key.to_string(), value.to_string())).or_insert(next)
        };
        for op in &self.ops {
            let input = match &op.request {
                Request::Put { value } => RegisterInput::Put(intern(&op.key, value)),
                Request::Get => RegisterInput::Get,
                Request::CompareAndSwap { expect, new } => RegisterInput::CompareAndSwap {
                    expect: expect.as_deref().map(|v| intern(&op.key, v)),
                    new: intern(&op.key, new),
                },
            };
            let output = match &op.response {
                Response::Failed { .. } if input == RegisterInput::Get => continue,
                Response::Failed { .. } => RegisterOutput::Unknown,
                Response::Put { .. } => RegisterOutput::Written,
                Response::Get { value, .. } => {
                    RegisterOutput::Read(value.as_deref().map(|v| intern(&op.key, v)))
                }
                Response::CompareAndSwap { swapped, .. } => RegisterOutput::Swapped(*swapped),
            };
            let entry = keys.entry(op.key.clone()).or_default();
            entry.ops.push(Operation {
                client: op.client,
                input,
                output,
                call: nanos(op.call),
                ret: op.ret.map(nanos),
            });
            entry.recorded.push(op.clone());
        }
        keys
    }

    /// A control for the checker on this very history: on the first key whose last read saw a
    /// value other than an earlier acknowledged put's, one more read of that put's value after
    /// everything else is added; the verdict must be a violation. `None` when no key fits.
    pub fn stale_read_control(&self, max_steps: usize) -> Option<Verdict> {
        for (_, mut key) in self.per_key() {
            let Some(last_read) = key.ops.iter().rev().find(|op| op.input == RegisterInput::Get) else {
                continue;
            };
            let RegisterOutput::Read(seen) = last_read.output else {
                continue;
            };
            let end = last_read.ret.unwrap_or(u64::MAX / 2);
            let stale = key.ops.iter().find_map(|op| match (&op.input, &op.output) {
                (RegisterInput::Put(v), RegisterOutput::Written)
                    if Some(*v) != seen && op.ret < Some(end) =>
                {
                    Some(*v)
                }
                _ => None,
            });
            let Some(stale) = stale else { continue };
            key.ops.push(Operation {
                client: usize::MAX,
                input: RegisterInput::Get,
                output: RegisterOutput::Read(Some(stale)),
                call: end + 1,
                ret: Some(end + 2),
            });
            return Some(linearizability::check(&Register, &key.ops, max_steps));
        }
        None
    }

    /// Checks every key's history, each with at most `max_steps` search steps.
    pub fn check_linearizable(&self, max_steps: usize) -> Vec<KeyVerdict> {
        self.per_key()
            .into_iter()
            .map(|(key, h)| KeyVerdict {
                operations: h.ops.len(),
                verdict: linearizability::check(&Register, &h.ops, max_steps),
                key,
                checked: h.recorded,
            })
            .collect()
    }
}

/// The shape of the load.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Concurrent clients, each with its own connection to every endpoint.
    pub clients: usize,
    /// Keys (`robust/0` ..).
    pub keys: usize,
    /// How long a client waits for an answer before it counts the outcome as unknown.
    pub timeout: Duration,
    /// Seeds each client's choice of operations.
    pub seed: u64,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            clients: 4,
            keys: 4,
            timeout: Duration::from_secs(2),
            seed: 0,
        }
    }
}

/// Runs one request.
async fn run(client: &mut Client, key: &str, request: &Request) -> Result<Response, etcd_client::Error> {
    let revision = |h: Option<&etcd_client::ResponseHeader>| h.map_or(0, |h| h.revision());
    Ok(match request {
        Request::Put { value } => {
            let r = client.put(key, value.as_str(), None).await?;
            Response::Put {
                revision: revision(r.header()),
            }
        }
        Request::Get => {
            let r = client.get(key, None).await?;
            Response::Get {
                value: r
                    .kvs()
                    .first()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
                revision: revision(r.header()),
            }
        }
        Request::CompareAndSwap { expect, new } => {
            let compare = match expect {
                Some(v) => Compare::value(key, CompareOp::Equal, v.as_str()),
                None => Compare::create_revision(key, CompareOp::Equal, 0),
            };
            let txn = Txn::new()
                .when([compare])
                .and_then([TxnOp::put(key, new.as_str(), None)]);
            let r = client.txn(txn).await?;
            Response::CompareAndSwap {
                swapped: r.succeeded(),
                revision: revision(r.header()),
            }
        }
    })
}

/// Runs `request` as client `client` and records it, timed against `started`.
pub async fn record(
    client: &mut Client,
    id: usize,
    key: &str,
    request: Request,
    timeout: Duration,
    started: Instant,
) -> Recorded {
    let call = started.elapsed();
    let answer = tokio::time::timeout(timeout, run(client, key, &request)).await;
    let at = started.elapsed();
    let (response, ret) = match answer {
        Ok(Ok(response)) => (response, Some(at)),
        Ok(Err(e)) => (Response::Failed { error: e.to_string() }, None),
        Err(_) => (
            Response::Failed {
                error: format!("no answer within {timeout:?}"),
            },
            None,
        ),
    };
    Recorded {
        client: id,
        key: key.to_string(),
        request,
        response,
        call,
        ret,
    }
}

/// Connects, retrying every 200 ms until it works or `stop` is set.
async fn connect(endpoints: &[String], timeout: Duration, stop: &AtomicBool) -> Option<Client> {
    while !stop.load(Ordering::SeqCst) {
        if let Ok(client) = Client::connect(endpoints, Some(super::client_options(timeout))).await {
            return Some(client);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

async fn one_client(
    endpoints: Vec<String>,
    config: LoadConfig,
    id: usize,
    started: Instant,
    stop: Arc<AtomicBool>,
) -> Vec<Recorded> {
    let mut ops = Vec::new();
    let Some(mut client) = connect(&endpoints, config.timeout, &stop).await else {
        return ops;
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(config.seed.wrapping_add(id as u64));
    let mut last_read: HashMap<String, Option<String>> = HashMap::new();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let key = format!("{KEY_PREFIX}{}", rng.random_range(0..config.keys.max(1)));
        let value = format!("c{id}-{n}");
        let request = match rng.random_range(0..100) {
            0..45 => Request::Put { value },
            45..90 => Request::Get,
            _ => Request::CompareAndSwap {
                expect: last_read.get(&key).cloned().flatten(),
                new: value,
            },
        };
        let op = record(&mut client, id, &key, request, config.timeout, started).await;
        let failed = matches!(op.response, Response::Failed { .. });
        if let Response::Get { value, .. } = &op.response {
            last_read.insert(key, value.clone());
        }
        ops.push(op);
        if failed {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    ops
}

/// Starts `config.clients` clients against `endpoints`; they run until `stop`, and the handle
/// gives their merged history.
pub fn start_load(
    endpoints: Vec<String>,
    config: LoadConfig,
    started: Instant,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<History> {
    tokio::spawn(async move {
        let tasks: Vec<_> = (0..config.clients)
            .map(|id| {
                tokio::spawn(one_client(
                    endpoints.clone(),
                    config.clone(),
                    id,
                    started,
                    stop.clone(),
                ))
            })
            .collect();
        let mut history = History::default();
        for task in tasks {
            // A client that panicked recorded nothing we can trust; its absence shows in the counts.
            if let Ok(ops) = task.await {
                history.ops.extend(ops);
            }
        }
        history
    })
}

/// Reads every key of the load once more as one more client (`id`), recorded into `history`, so
/// that the end state is part of what is checked.
pub async fn final_reads(
    history: &mut History,
    endpoints: &[String],
    config: &LoadConfig,
    started: Instant,
) -> Result<(), super::RobustnessError> {
    let mut client = Client::connect(endpoints, Some(super::client_options(config.timeout)))
        .await
        .map_err(|source| super::RobustnessError::Connect {
            endpoints: endpoints.to_vec(),
            source,
        })?;
    let id = config.clients;
    for k in 0..config.keys {
        let key = format!("{KEY_PREFIX}{k}");
        let op = record(&mut client, id, &key, Request::Get, config.timeout * 5, started).await;
        history.ops.push(op);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(
        client: usize,
        key: &str,
        request: Request,
        response: Response,
        call: u64,
        ret: Option<u64>,
    ) -> Recorded {
        Recorded {
            client,
            key: key.into(),
            request,
            response,
            call: Duration::from_millis(call),
            ret: ret.map(Duration::from_millis),
        }
    }

    fn put(v: &str) -> Request {
        Request::Put { value: v.into() }
    }

    fn got(v: Option<&str>) -> Response {
        Response::Get {
            value: v.map(str::to_owned),
            revision: 0,
        }
    }

    #[test]
    fn keys_are_checked_apart_and_a_stale_read_on_one_is_found() {
        let ops = vec![
            op(0, "a", put("1"), Response::Put { revision: 2 }, 0, Some(10)),
            op(1, "b", put("x"), Response::Put { revision: 3 }, 0, Some(10)),
            op(0, "a", put("2"), Response::Put { revision: 4 }, 20, Some(30)),
            // Failed reads are left out; a failed put may have happened.
            op(
                2,
                "a",
                Request::Get,
                Response::Failed {
                    error: "timeout".into(),
                },
                31,
                None,
            ),
            op(
                2,
                "b",
                put("y"),
                Response::Failed {
                    error: "timeout".into(),
                },
                32,
                None,
            ),
            op(1, "b", Request::Get, got(Some("y")), 40, Some(50)),
            op(1, "a", Request::Get, got(Some("1")), 40, Some(50)),
        ];
        let history = History { ops };
        let verdicts = history.check_linearizable(100_000);
        assert_eq!(verdicts.len(), 2);
        assert_eq!(verdicts[0].key, "a");
        assert_eq!(verdicts[0].operations, 3, "the failed read is left out");
        assert!(verdicts[0].verdict.is_violation(), "{:?}", verdicts[0].verdict);
        assert_eq!(verdicts[1].verdict, Verdict::Linearizable);
        assert_eq!(history.acknowledged_writes().len(), 3);
        assert_eq!(history.failed(), 2);
        assert!(history.attempted_writes().contains(&("b", "y")));
    }

    #[test]
    fn the_stale_read_control_turns_a_good_history_bad() {
        let ops = vec![
            op(0, "a", put("1"), Response::Put { revision: 2 }, 0, Some(10)),
            op(0, "a", put("2"), Response::Put { revision: 3 }, 20, Some(30)),
            op(1, "a", Request::Get, got(Some("2")), 40, Some(50)),
        ];
        let history = History { ops };
        assert_eq!(history.check_linearizable(1000)[0].verdict, Verdict::Linearizable);
        let control = history.stale_read_control(1000).unwrap();
        assert!(control.is_violation(), "{control:?}");
        // Nothing to turn stale: no read.
        let only_puts = History {
            ops: vec![op(0, "a", put("1"), Response::Put { revision: 2 }, 0, Some(10))],
        };
        assert_eq!(only_puts.stale_read_control(1000), None);
    }

    #[test]
    fn the_watch_settles_unknown_writes() {
        let failed = || Response::Failed {
            error: "timeout".into(),
        };
        let cas = |new: &str| Request::CompareAndSwap {
            expect: Some("1".into()),
            new: new.into(),
        };
        let ops = vec![
            op(0, "a", put("1"), Response::Put { revision: 2 }, 0, Some(10)),
            // Happened at 3: answered by 40 at the latest (the read at revision 4 returned then).
            op(1, "a", put("2"), failed(), 5, None),
            // Never happened: left out.
            op(2, "a", put("3"), failed(), 6, None),
            op(2, "a", cas("9"), failed(), 7, None),
            op(0, "b", put("x"), Response::Put { revision: 4 }, 20, Some(30)),
            op(0, "a", Request::Get, got(Some("2")), 35, Some(40)),
            // Happened at 5, after everything anyone observed: still unknown.
            op(1, "a", put("4"), failed(), 50, None),
        ];
        let event = |key: &str, value: &str, revision| crate::robustness::watch::WatchedEvent {
            revision,
            key: key.into(),
            value: value.into(),
            put: true,
        };
        let events = [
            event("a", "1", 2),
            event("a", "2", 3),
            event("b", "x", 4),
            event("a", "4", 5),
        ];
        let settled = History { ops }.settled_by_watch(&events);
        assert_eq!(settled.ops.len(), 5, "{settled:?}");
        assert_eq!(settled.ops[1].response, Response::Put { revision: 3 });
        assert_eq!(
            settled.ops[1].ret,
            Some(Duration::from_millis(30)),
            "the put at 4 answered at 30"
        );
        assert_eq!(settled.ops[4].ret, None);
        assert_eq!(settled.check_linearizable(1000)[0].verdict, Verdict::Linearizable);
    }

    #[test]
    fn a_swap_is_an_acknowledged_write_only_when_it_swapped() {
        let cas = |new: &str| Request::CompareAndSwap {
            expect: None,
            new: new.into(),
        };
        let ops = vec![
            op(
                0,
                "a",
                cas("1"),
                Response::CompareAndSwap {
                    swapped: true,
                    revision: 2,
                },
                0,
                Some(1),
            ),
            op(
                1,
                "a",
                cas("2"),
                Response::CompareAndSwap {
                    swapped: false,
                    revision: 2,
                },
                2,
                Some(3),
            ),
            op(1, "a", Request::Get, got(Some("1")), 4, Some(5)),
        ];
        let history = History { ops };
        assert_eq!(
            history.acknowledged_writes(),
            vec![AckedWrite {
                key: "a".into(),
                value: "1".into(),
                revision: 2
            }]
        );
        assert_eq!(history.check_linearizable(1000)[0].verdict, Verdict::Linearizable);
    }
}
