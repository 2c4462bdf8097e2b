//! Writing status: a JSON patch conditional on the resourceVersion read, retried on conflict with
//! what other writers own (the backup controller's `lastBackup` and condition) taken from the
//! fresh copy.

use etcd_operator_api::status::EtcdClusterStatus;
use etcd_operator_api::v1alpha2::EtcdCluster;
use kube::api::{Api, Patch};

use super::ReconcileError;
use crate::status;

/// How often a status write is tried again after a conflict before the reconcile gives up
/// (and is requeued by the error policy).
pub(super) const STATUS_WRITE_ATTEMPTS: usize = 4;

/// Writes `ours` as the status, conditional on the resourceVersion it is written onto. Another
/// writer of the same status (the backup controller: `lastBackup` and its condition) may write
/// between our read and our write; the API server then answers 409, and the status is read again
/// and what the other writer owns is taken from it before the next try. Nothing is written when
/// the stored status already says the same.
pub(super) async fn write_status(
    api: &Api<EtcdCluster>,
    obj: &EtcdCluster,
    ours: &EtcdClusterStatus,
) -> Result<(), ReconcileError> {
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    let mut stored_status = obj.status.clone();
    let mut resource_version = obj.metadata.resource_version.clone().unwrap_or_default();
    let mut last_conflict = None;
    for _ in 0..STATUS_WRITE_ATTEMPTS {
        let status = status::rebase(ours, stored_status.as_ref());
        if stored_status
            .as_ref()
            .is_some_and(|old| !status::differs(old, &status))
        {
            return Ok(());
        }
        let patch = serde_json::from_value(status::status_patch(&status, &resource_version))
            .map_err(|e| ReconcileError::PatchStatus(kube::Error::SerdeError(e)))?;
        match api
            .patch_status(
                name,
                &crate::resources::status_patch_params(),
                &Patch::<()>::Json(patch),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(cluster = %name, "status changed since it was read; reading it again");
                last_conflict = Some(kube::Error::Api(e));
                let fresh = api.get_status(name).await.map_err(ReconcileError::ReadStatus)?;
                stored_status = fresh.status;
                resource_version = fresh.metadata.resource_version.unwrap_or_default();
            }
            Err(e) => return Err(ReconcileError::PatchStatus(e)),
        }
    }
    Err(ReconcileError::StatusConflict(Box::new(
        last_conflict
            .unwrap_or_else(|| kube::Error::Service(Box::new(std::io::Error::other("status conflict")))),
    )))
}

#[cfg(test)]
mod tests {
    //! The status write against a scripted API server (tower-test): the exact requests it makes
    //! when the backup controller wrote in between, and its failure paths.
    // The scripted scenario holds the kube client's request futures; it is awaited once per test.
    #![allow(clippy::large_futures)]

    use super::*;
    use etcd_operator_api::status::BackupStatus;
    use http::{Method, Request, Response, StatusCode};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kube::client::Body;
    use serde_json::{Value, json};
    use std::pin::pin;
    use std::time::Duration;
    use tower_test::mock;

    const PATH: &str = "/apis/etcd.operator.dev/v1alpha2/namespaces/prod/etcdclusters/demo/status";

    type Handle = mock::Handle<Request<Body>, Response<Body>>;

    fn cluster(resource_version: &str, status: Option<EtcdClusterStatus>) -> EtcdCluster {
        let mut c = EtcdCluster::default();
        c.metadata.name = Some("demo".into());
        c.metadata.namespace = Some("prod".into());
        c.metadata.resource_version = Some(resource_version.into());
        c.status = status;
        c
    }

    fn condition(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Because".into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
        }
    }

    fn backup(revision: i64) -> BackupStatus {
        BackupStatus {
            revision: Some(revision),
            ..Default::default()
        }
    }

    /// What the member reconciler computed from the object at resourceVersion 5.
    fn ours() -> EtcdClusterStatus {
        EtcdClusterStatus {
            ready_replicas: Some(3),
            last_backup: Some(Box::new(backup(4))),
            conditions: Some(vec![
                condition("Available", "True"),
                condition("BackupSucceeded", "False"),
            ]),
            ..Default::default()
        }
    }

    /// What the backup controller wrote after the reconciler read the object (resourceVersion 8).
    fn written_by_backup() -> EtcdCluster {
        cluster(
            "8",
            Some(EtcdClusterStatus {
                ready_replicas: Some(1),
                last_backup: Some(Box::new(backup(9))),
                conditions: Some(vec![
                    condition("Available", "False"),
                    condition("BackupSucceeded", "True"),
                ]),
                ..Default::default()
            }),
        )
    }

    async fn expect(handle: &mut Handle, method: Method) -> (Value, mock::SendResponse<Response<Body>>) {
        let mut handle = pin!(handle);
        let (request, send) = handle.next_request().await.expect("a request");
        assert_eq!(request.method(), method);
        assert_eq!(request.uri().path(), PATH);
        if method == Method::PATCH {
            assert_eq!(request.uri().query(), Some("&fieldManager=etcd-operator"));
        }
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        (body, send)
    }

    fn reply(send: mock::SendResponse<Response<Body>>, code: StatusCode, body: &Value) {
        send.send_response(
            Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(body).unwrap()))
                .unwrap(),
        );
    }

    fn conflict() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
            "message": "the object has been modified; please apply your changes to the latest version and try again"})
    }

    /// Runs `write_status(obj, ours())` beside `script`.
    async fn run(obj: EtcdCluster, script: impl AsyncFnOnce(&mut Handle)) -> Result<(), ReconcileError> {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let api: Api<EtcdCluster> = Api::namespaced(kube::Client::new(service, "default"), "prod");
        let write = async move { write_status(&api, &obj, &ours()).await };
        let server = async move {
            script(&mut handle).await;
            let mut handle = pin!(&mut handle);
            if let Some((request, _)) = handle.next_request().await {
                panic!("unexpected request {} {}", request.method(), request.uri());
            }
        };
        let (out, ()) = tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(write, server) })
            .await
            .expect("the write waits for an answer the script does not give");
        out
    }

    #[tokio::test]
    async fn a_backup_written_between_read_and_write_survives() {
        let out = run(cluster("5", None), async |api| {
            let (body, send) = expect(api, Method::PATCH).await;
            assert_eq!(
                body[0],
                json!({"op": "add", "path": "/metadata/resourceVersion", "value": "5"})
            );
            assert_eq!(body[1]["value"]["lastBackup"]["revision"], 4);
            reply(send, StatusCode::CONFLICT, &conflict());
            let (_, send) = expect(api, Method::GET).await;
            reply(
                send,
                StatusCode::OK,
                &serde_json::to_value(written_by_backup()).unwrap(),
            );
            let (body, send) = expect(api, Method::PATCH).await;
            assert_eq!(body[0]["value"], "8");
            let status = &body[1]["value"];
            // The backup controller's fields from the fresh object, ours for the rest.
            assert_eq!(status["lastBackup"]["revision"], 9);
            assert_eq!(status["readyReplicas"], 3);
            let conditions: Vec<(&str, &str)> = status["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
                .collect();
            assert_eq!(conditions, [("Available", "True"), ("BackupSucceeded", "True")]);
            reply(
                send,
                StatusCode::OK,
                &serde_json::to_value(cluster("9", None)).unwrap(),
            );
        })
        .await;
        assert!(out.is_ok(), "{out:?}");
    }

    #[tokio::test]
    async fn an_unchanged_status_is_not_written() {
        let stored = status::rebase(&ours(), None);
        let out = run(cluster("5", Some(stored)), async |_| {}).await;
        assert!(out.is_ok(), "{out:?}");
    }

    #[tokio::test]
    async fn a_status_that_keeps_changing_gives_up_after_the_attempts() {
        let out = run(cluster("5", None), async |api| {
            for _ in 0..STATUS_WRITE_ATTEMPTS {
                let (_, send) = expect(api, Method::PATCH).await;
                reply(send, StatusCode::CONFLICT, &conflict());
                let (_, send) = expect(api, Method::GET).await;
                reply(
                    send,
                    StatusCode::OK,
                    &serde_json::to_value(written_by_backup()).unwrap(),
                );
            }
        })
        .await;
        assert!(matches!(out, Err(ReconcileError::StatusConflict(_))), "{out:?}");
    }

    #[tokio::test]
    async fn other_write_and_read_errors_are_returned() {
        let out = run(cluster("5", None), async |api| {
            let (_, send) = expect(api, Method::PATCH).await;
            reply(
                send,
                StatusCode::FORBIDDEN,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "no"}),
            );
        })
        .await;
        assert!(
            matches!(out, Err(ReconcileError::PatchStatus(kube::Error::Api(ref e))) if e.code == 403),
            "{out:?}"
        );
        let out = run(cluster("5", None), async |api| {
            let (_, send) = expect(api, Method::PATCH).await;
            reply(send, StatusCode::CONFLICT, &conflict());
            let (_, send) = expect(api, Method::GET).await;
            reply(
                send,
                StatusCode::NOT_FOUND,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "gone"}),
            );
        })
        .await;
        assert!(
            matches!(out, Err(ReconcileError::ReadStatus(kube::Error::Api(ref e))) if e.code == 404),
            "{out:?}"
        );
    }
}
