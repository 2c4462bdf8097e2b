//! Member process exits in local mode, told to the controller as they happen: the kubernetes
//! runtime learns of a dead member from its Pod's watch event, while a local process sends
//! nothing, so without this a killed member waited for the next resync (up to 3 s) before it
//! was started again.
//!
//! A process this operator started is its child: waiting on it tells the moment it ends. One
//! started by an earlier operator (re-adopted by pid after a restart) is not, so its
//! `/proc/<pid>` is looked at every [`POLL`]. Either way the member's cluster is sent on a
//! channel that the controller reconciles on (`Controller::reconcile_on`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_operator_api::v1alpha2::EtcdCluster;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use crate::model::ClusterRef;

/// How often the processes of re-adopted members are looked at.
pub(super) const POLL: Duration = Duration::from_millis(250);

/// A process being watched: its start time (a pid reused by another process is not it) and its
/// cluster.
type Watched = HashMap<u32, (u64, ObjectRef<EtcdCluster>)>;

/// Where exits are told, and what is watched.
#[derive(Debug)]
pub(super) struct Exits {
    sender: mpsc::UnboundedSender<ObjectRef<EtcdCluster>>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<ObjectRef<EtcdCluster>>>>,
    /// Re-adopted processes, by pid.
    adopted: Arc<Mutex<Watched>>,
    /// The pids of the running children (waited on, not looked at).
    children: Arc<Mutex<std::collections::HashSet<u32>>>,
}

impl Default for Exits {
    fn default() -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        Self {
            sender,
            receiver: Mutex::new(Some(receiver)),
            adopted: Arc::default(),
            children: Arc::default(),
        }
    }
}

fn object_ref(cluster: &ClusterRef) -> ObjectRef<EtcdCluster> {
    ObjectRef::new(&cluster.name).within(&cluster.namespace)
}

impl Exits {
    /// Waits on `child` (a member process just started) in the background: reaps it when it
    /// exits and tells its cluster.
    pub(super) fn child(&self, cluster: &ClusterRef, mut child: tokio::process::Child) {
        let sender = self.sender.clone();
        let cluster = object_ref(cluster);
        let children = Arc::clone(&self.children);
        let pid = child.id();
        if let (Some(pid), Ok(mut running)) = (pid, children.lock()) {
            running.insert(pid);
        }
        tokio::spawn(async move {
            let _ = child.wait().await;
            if let (Some(pid), Ok(mut running)) = (pid, children.lock()) {
                running.remove(&pid);
            }
            // Nobody listening (no controller took the receiver) is fine: the resync looks.
            let _ = sender.send(cluster);
        });
    }

    /// Watches `pid` (started at `start`, a member of `cluster` that this process did not
    /// start) until it ends. Idempotent; a child of this process is waited on instead.
    pub(super) fn adopted(&self, cluster: &ClusterRef, pid: u32, start: u64) {
        if self.children.lock().is_ok_and(|running| running.contains(&pid)) {
            return;
        }
        if let Ok(mut adopted) = self.adopted.lock() {
            adopted.entry(pid).or_insert_with(|| (start, object_ref(cluster)));
        }
    }

    /// The clusters whose member processes exit, as they do; the first call gets them (later
    /// ones `None`). Starts looking at re-adopted processes (from a tokio runtime).
    pub(super) fn stream(
        &self,
    ) -> Option<impl futures::Stream<Item = ObjectRef<EtcdCluster>> + Send + 'static> {
        let receiver = self.receiver.lock().ok()?.take()?;
        let adopted = Arc::clone(&self.adopted);
        let sender = self.sender.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                for cluster in ended(&adopted, super::proc_state) {
                    if sender.send(cluster).is_err() {
                        return;
                    }
                }
            }
        });
        Some(futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|cluster| (cluster, receiver))
        }))
    }
}

/// The clusters of the watched processes that ended (by `state`: `None` for no process, else
/// its state letter and start time), which stop being watched.
fn ended(
    adopted: &Mutex<Watched>,
    state: impl Fn(u32) -> Option<(char, u64)>,
) -> Vec<ObjectRef<EtcdCluster>> {
    let Ok(mut adopted) = adopted.lock() else {
        return Vec::new();
    };
    let gone: Vec<u32> = adopted
        .iter()
        .filter(|(pid, (start, _))| {
            !matches!(state(**pid), Some((letter, started)) if letter != 'Z' && started == *start)
        })
        .map(|(pid, _)| *pid)
        .collect();
    gone.iter()
        .filter_map(|pid| adopted.remove(pid).map(|(_, cluster)| cluster))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;

    fn cluster(name: &str) -> ClusterRef {
        ClusterRef {
            namespace: "ns".into(),
            name: name.into(),
            uid: "u".into(),
        }
    }

    #[test]
    fn a_watched_process_that_ended_or_was_replaced_tells_its_cluster_once() {
        let exits = Exits::default();
        exits.adopted(&cluster("a"), 10, 100);
        exits.adopted(&cluster("b"), 11, 200);
        exits.adopted(&cluster("c"), 12, 300);
        exits.adopted(&cluster("d"), 13, 400);
        // Adopting again keeps what was there.
        exits.adopted(&cluster("z"), 10, 100);
        let state = |pid: u32| match pid {
            10 => Some(('S', 100)), // runs
            11 => None,             // gone
            12 => Some(('Z', 300)), // exited, not reaped
            13 => Some(('S', 999)), // the pid is another process's now
            _ => None,
        };
        let mut told: Vec<String> = ended(&exits.adopted, state).into_iter().map(|r| r.name).collect();
        told.sort();
        assert_eq!(told, ["b", "c", "d"]);
        // Told once; the one that runs is still watched.
        assert!(ended(&exits.adopted, state).is_empty());
        let still: Vec<u32> = exits.adopted.lock().unwrap().keys().copied().collect();
        assert_eq!(still, [10]);
        assert_eq!(exits.adopted.lock().unwrap()[&10].1.name, "a");
    }

    #[tokio::test]
    async fn a_child_that_exits_tells_its_cluster_and_the_stream_is_had_once() {
        let exits = Exits::default();
        let mut stream = std::pin::pin!(exits.stream().unwrap());
        assert!(exits.stream().is_none(), "a second stream");
        let child = tokio::process::Command::new("sleep").arg("0.2").spawn().unwrap();
        let pid = child.id().unwrap();
        exits.child(&cluster("k"), child);
        // A child is waited on, not looked at.
        exits.adopted(&cluster("k"), pid, 1);
        assert!(exits.adopted.lock().unwrap().is_empty());
        let told = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((told.name.as_str(), told.namespace.as_deref()), ("k", Some("ns")));
    }

    #[tokio::test]
    async fn an_adopted_process_that_ends_is_told_by_looking() {
        let exits = Exits::default();
        let mut stream = std::pin::pin!(exits.stream().unwrap());
        // A process this test starts stands for one an earlier operator started.
        let mut process = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let (_, start) = super::super::proc_state(process.id()).unwrap();
        exits.adopted(&cluster("old"), process.id(), start);
        process.kill().unwrap();
        process.wait().unwrap();
        let told = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(told.name, "old");
    }
}
