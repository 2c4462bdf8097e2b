//! Choosing where a snapshot comes from: a healthy member, a follower when there is one (so the
//! leader keeps its bandwidth), trying the next when one fails. The streaming and the integrity
//! check are [`MemberOps::snapshot_stream`]'s.

use crate::member_ops::MemberOps;
pub use crate::member_ops::{SnapshotError, SnapshotStream, Verified};
use crate::model::is_healthy;

/// The members to try, best first: healthy followers, then the healthy leader. Uses the member
/// list etcd reports (asked at `endpoints`), so a stale status cannot send us to a dead member.
pub async fn candidates(ops: &impl MemberOps, endpoints: &[String]) -> Vec<String> {
    let Ok(view) = ops.observe(endpoints).await else {
        return Vec::new();
    };
    let mut healthy: Vec<(bool, String)> = view
        .voters()
        .filter(|m| is_healthy(m))
        .filter_map(|m| Some((m.id == view.leader, m.client_urls.first()?.clone())))
        .collect();
    // Followers (false) sort before the leader (true).
    healthy.sort();
    healthy.into_iter().map(|(_, url)| url).collect()
}

/// Opens a snapshot stream at the best healthy member among those `endpoints` lead to, trying
/// the next one when a member fails to start streaming. A failure once chunks flow is the
/// consumer's to see (the stream yields it): what was already passed on cannot be taken back.
pub async fn open(ops: &impl MemberOps, endpoints: &[String]) -> Result<SnapshotStream, SnapshotError> {
    let candidates = candidates(ops, endpoints).await;
    let mut last = SnapshotError::NoHealthyMember {
        asked: endpoints.to_vec(),
    };
    for endpoint in candidates {
        match ops.snapshot_stream(&endpoint).await {
            Ok(stream) => return Ok(stream),
            Err(e) => {
                tracing::warn!(%endpoint, error = %etcd_operator_api::report::Chain(&e), "snapshot failed; trying another member");
                last = e;
            }
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member_ops::MemberOpError;
    use crate::member_ops::fake::{Call, FakeMemberOps, healthy_member};
    use crate::model::EtcdView;

    fn three() -> EtcdView {
        EtcdView {
            cluster_id: 1,
            members: vec![
                healthy_member(1, "a", "3.5.1", 1),
                healthy_member(2, "b", "3.5.1", 1),
                healthy_member(3, "c", "3.5.1", 1),
            ],
            leader: 1,
            alarms: Vec::new(),
        }
    }

    #[tokio::test]
    async fn followers_first_then_the_next_member_when_one_fails() {
        let ops = FakeMemberOps::new(Some(three()));
        ops.fail_next_snapshot(SnapshotError::Timeout {
            endpoint: "http://b:2379".into(),
            after: std::time::Duration::from_secs(600),
        });
        let snap = open(&ops, &["http://a:2379".into()]).await.unwrap();
        assert_eq!(snap.endpoint, "http://c:2379");
        let asked: Vec<Call> = ops.actions();
        assert_eq!(
            asked,
            [
                Call::Snapshot {
                    endpoint: "http://b:2379".into()
                },
                Call::Snapshot {
                    endpoint: "http://c:2379".into()
                }
            ]
        );
    }

    #[tokio::test]
    async fn no_healthy_member_and_every_member_failing_are_errors() {
        let ops = FakeMemberOps::new(None);
        let err = open(&ops, &["http://a:2379".into()]).await.unwrap_err();
        assert!(matches!(err, SnapshotError::NoHealthyMember { .. }), "{err}");

        let mut sick = three();
        for m in &mut sick.members {
            m.status = None;
        }
        let ops = FakeMemberOps::new(Some(sick));
        let err = open(&ops, &["http://a:2379".into()]).await.unwrap_err();
        assert!(matches!(err, SnapshotError::NoHealthyMember { .. }), "{err}");

        let ops = FakeMemberOps::new(Some(three()));
        for endpoint in ["b", "c", "a"] {
            ops.fail_next_snapshot(SnapshotError::Etcd {
                endpoint: format!("http://{endpoint}:2379"),
                source: MemberOpError::NoEndpoint { op: "snapshot" },
            });
        }
        let err = open(&ops, &["http://a:2379".into()]).await.unwrap_err();
        assert!(
            matches!(&err, SnapshotError::Etcd { endpoint, .. } if endpoint == "http://a:2379"),
            "the leader is tried last: {err}"
        );
    }
}
