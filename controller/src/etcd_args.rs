//! The one etcd command line: from the validated cluster and where one member lives (its URLs,
//! data directory and certificate files, which is all that differs between the local and the
//! kubernetes runtime), the flags its etcd process starts with. Pure; both runtimes call it.

use crate::model::MemberConfig;
use crate::validated::ValidatedCluster;

/// The certificate files of one TLS plane, as the etcd process sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The member's certificate (PEM).
    pub cert: String,
    /// Its private key (PEM).
    pub key: String,
    /// The CA bundle the plane trusts for the other side's certificates.
    pub trusted_ca: String,
}

/// One member as its etcd process is placed: what the runtime decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberLaunch<'a> {
    /// The member's name (`--name`).
    pub name: &'a str,
    /// Its start configuration (initial cluster, state, token).
    pub config: &'a MemberConfig,
    /// The data directory.
    pub data_dir: String,
    /// Where it listens for peers, e.g. `https://0.0.0.0:2380`.
    pub listen_peer_url: String,
    /// The peer URL it advertises (the one in `--initial-cluster`).
    pub advertise_peer_url: String,
    /// Where it listens for clients.
    pub listen_client_url: String,
    /// The client URL it advertises.
    pub advertise_client_url: String,
    /// A plain-HTTP metrics and health listener, when the runtime probes one.
    pub listen_metrics_url: Option<String>,
    /// The client plane's certificate files, when it uses TLS (client certificates required).
    pub client_tls: Option<TlsFiles>,
    /// The peer plane's certificate files, when it uses TLS (mutual).
    pub peer_tls: Option<TlsFiles>,
    /// Start once as a one-member cluster on its data (quorum recovery).
    pub force_new_cluster: bool,
}

/// The flags of the member's etcd process (without the program name), in a fixed order:
/// identity and data, URLs, initial cluster, metrics, TLS, the flags the spec's maintenance
/// amounts to, and last `--force-new-cluster` when asked.
pub fn etcd_args(cluster: &ValidatedCluster, member: &MemberLaunch<'_>) -> Vec<String> {
    let config = member.config;
    let mut args = vec![
        format!("--name={}", member.name),
        format!("--data-dir={}", member.data_dir),
        format!("--listen-peer-urls={}", member.listen_peer_url),
        format!("--listen-client-urls={}", member.listen_client_url),
        format!("--advertise-client-urls={}", member.advertise_client_url),
        format!("--initial-advertise-peer-urls={}", member.advertise_peer_url),
        format!("--initial-cluster={}", config.initial_cluster_flag()),
        format!("--initial-cluster-state={}", config.initial_state.as_str()),
        format!("--initial-cluster-token={}", config.cluster_token),
    ];
    if let Some(url) = &member.listen_metrics_url {
        args.push(format!("--listen-metrics-urls={url}"));
    }
    if let Some(files) = &member.client_tls {
        args.extend([
            format!("--cert-file={}", files.cert),
            format!("--key-file={}", files.key),
            format!("--trusted-ca-file={}", files.trusted_ca),
            "--client-cert-auth=true".to_owned(),
        ]);
    }
    if let Some(files) = &member.peer_tls {
        args.extend([
            format!("--peer-cert-file={}", files.cert),
            format!("--peer-key-file={}", files.key),
            format!("--peer-trusted-ca-file={}", files.trusted_ca),
            "--peer-client-cert-auth=true".to_owned(),
        ]);
    }
    args.extend(cluster.maintenance_flags.iter().cloned());
    if member.force_new_cluster {
        args.push("--force-new-cluster".to_owned());
    }
    args
}

#[cfg(test)]
mod tests {
    use etcd_operator_api::v1alpha2::{AutoCompactionMode, AutoCompactionSpec, EtcdCluster, MaintenanceSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::model::InitialState;

    fn config() -> MemberConfig {
        MemberConfig {
            version: "3.5.16".into(),
            initial_cluster: vec![
                ("c-a".into(), "https://c-a.c.ns.svc:2380".into()),
                ("c-b".into(), "https://c-b.c.ns.svc:2380".into()),
            ],
            initial_state: InitialState::Existing,
            cluster_token: "ns-c-uid".into(),
            previous_version: None,
            restore: None,
        }
    }

    fn files(dir: &str) -> TlsFiles {
        TlsFiles {
            cert: format!("{dir}/tls.crt"),
            key: format!("{dir}/tls.key"),
            trusted_ca: format!("{dir}/ca.crt"),
        }
    }

    /// A Pod's command line: every flag, in order, with TLS on both planes and a maintenance spec.
    #[test]
    fn golden_kubernetes_member_with_tls_and_maintenance() {
        let mut obj = EtcdCluster::new("c", "ns", Default::default());
        obj.spec.maintenance = Some(Box::new(MaintenanceSpec {
            auto_compaction: Some(AutoCompactionSpec {
                mode: Some(AutoCompactionMode::Revision),
                retention: Some("5000".into()),
            }),
            quota_backend_bytes: Some(Quantity("4Gi".into())),
            ..Default::default()
        }));
        let cluster = ValidatedCluster::for_test(obj);
        let config = config();
        let launch = MemberLaunch {
            name: "c-b",
            config: &config,
            data_dir: "/var/lib/etcd/data".into(),
            listen_peer_url: "https://0.0.0.0:2380".into(),
            advertise_peer_url: "https://c-b.c.ns.svc:2380".into(),
            listen_client_url: "https://0.0.0.0:2379".into(),
            advertise_client_url: "https://c-b.c.ns.svc:2379".into(),
            listen_metrics_url: Some("http://0.0.0.0:2381".into()),
            client_tls: Some(files("/etc/etcd/client")),
            peer_tls: Some(files("/etc/etcd/peer")),
            force_new_cluster: false,
        };
        assert_eq!(
            etcd_args(&cluster, &launch),
            [
                "--name=c-b",
                "--data-dir=/var/lib/etcd/data",
                "--listen-peer-urls=https://0.0.0.0:2380",
                "--listen-client-urls=https://0.0.0.0:2379",
                "--advertise-client-urls=https://c-b.c.ns.svc:2379",
                "--initial-advertise-peer-urls=https://c-b.c.ns.svc:2380",
                "--initial-cluster=c-a=https://c-a.c.ns.svc:2380,c-b=https://c-b.c.ns.svc:2380",
                "--initial-cluster-state=existing",
                "--initial-cluster-token=ns-c-uid",
                "--listen-metrics-urls=http://0.0.0.0:2381",
                "--cert-file=/etc/etcd/client/tls.crt",
                "--key-file=/etc/etcd/client/tls.key",
                "--trusted-ca-file=/etc/etcd/client/ca.crt",
                "--client-cert-auth=true",
                "--peer-cert-file=/etc/etcd/peer/tls.crt",
                "--peer-key-file=/etc/etcd/peer/tls.key",
                "--peer-trusted-ca-file=/etc/etcd/peer/ca.crt",
                "--peer-client-cert-auth=true",
                "--auto-compaction-mode=revision",
                "--auto-compaction-retention=5000",
                "--quota-backend-bytes=4294967296",
            ]
        );
    }

    /// A local process's command line: plain HTTP, no metrics listener, the default maintenance
    /// flags, and `--force-new-cluster` last when a quorum recovery asks for it.
    #[test]
    fn golden_local_member_plain_and_forced() {
        let cluster = ValidatedCluster::for_test(EtcdCluster::new("c", "ns", Default::default()));
        let mut config = config();
        config.initial_cluster = vec![("c-a".into(), "http://127.0.0.1:30002".into())];
        config.initial_state = InitialState::New;
        let mut launch = MemberLaunch {
            name: "c-a",
            config: &config,
            data_dir: "/state/members/ns/c/c-a/data".into(),
            listen_peer_url: "http://127.0.0.1:30002".into(),
            advertise_peer_url: "http://127.0.0.1:30002".into(),
            listen_client_url: "http://127.0.0.1:30001".into(),
            advertise_client_url: "http://127.0.0.1:30001".into(),
            listen_metrics_url: None,
            client_tls: None,
            peer_tls: None,
            force_new_cluster: false,
        };
        let expected = [
            "--name=c-a",
            "--data-dir=/state/members/ns/c/c-a/data",
            "--listen-peer-urls=http://127.0.0.1:30002",
            "--listen-client-urls=http://127.0.0.1:30001",
            "--advertise-client-urls=http://127.0.0.1:30001",
            "--initial-advertise-peer-urls=http://127.0.0.1:30002",
            "--initial-cluster=c-a=http://127.0.0.1:30002",
            "--initial-cluster-state=new",
            "--initial-cluster-token=ns-c-uid",
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=1h",
        ];
        let args = etcd_args(&cluster, &launch);
        assert_eq!(args[..expected.len()], expected);
        // The default quota follows the default storage size; it is the only other flag.
        assert_eq!(args.len(), expected.len() + 1);
        assert!(
            args[expected.len()].starts_with("--quota-backend-bytes="),
            "{args:?}"
        );
        launch.force_new_cluster = true;
        let forced = etcd_args(&cluster, &launch);
        assert_eq!(forced.last().map(String::as_str), Some("--force-new-cluster"));
        assert_eq!(forced[..args.len()], args[..]);
    }
}
