//! The two Services of a cluster: the headless peer Service that gives every member its DNS name
//! (also before it is ready: `publishNotReadyAddresses`), and the client Service.

use etcd_operator_api::naming;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{CLIENT_PORT, PEER_PORT, cluster_labels, owner_reference, selector_labels};
use crate::model::ClusterRef;

fn port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port,
        target_port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    }
}

fn metadata(cluster: &ClusterRef, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(cluster.namespace.clone()),
        labels: Some(cluster_labels(cluster)),
        owner_references: Some(vec![owner_reference(cluster)]),
        ..ObjectMeta::default()
    }
}

/// Headless Service `<cluster>` of the members: members resolve as
/// `<member>.<cluster>.<namespace>.svc` as soon as their Pod exists, which etcd needs to bootstrap.
pub fn build_peer_service(cluster: &ClusterRef) -> Service {
    Service {
        metadata: metadata(cluster, naming::peer_service_name(&cluster.name)),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            cluster_ip: Some("None".to_owned()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(cluster)),
            ports: Some(vec![port("peer", PEER_PORT), port("client", CLIENT_PORT)]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Service `<cluster>-client` clients connect to: ready members only.
pub fn build_client_service(cluster: &ClusterRef) -> Service {
    Service {
        metadata: metadata(cluster, naming::client_service_name(&cluster.name)),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(selector_labels(cluster)),
            ports: Some(vec![port("client", CLIENT_PORT)]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}
