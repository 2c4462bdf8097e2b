//! `kubectl-etcd`, the `kubectl etcd` plugin: day-2 commands for EtcdClusters through the
//! Kubernetes API (the user's kubeconfig, so through the aggregator or straight to
//! `etcd-operator local`). Every change is an annotation the controller acts on or the
//! `/snapshot` subresource; nothing here talks to etcd. Exit codes: see
//! [`kubectl_etcd::cli::EXIT_CODES_HELP`].

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser as _;
use etcd_operator_api::v1alpha2::EtcdCluster;
use kube::api::{Api, Patch, PatchParams};

use kubectl_etcd::cli::{Cli, Command, Global};
use kubectl_etcd::requests::{self, Confirmation, Request, RequestError};
use kubectl_etcd::{env, render, snapshot};

/// Exit code: an error.
const EXIT_ERROR: u8 = 1;
/// Exit code: refused or not confirmed, nothing changed.
const EXIT_REFUSED: u8 = 3;

/// Why a command failed, named for what it was doing.
#[derive(Debug, thiserror::Error)]
enum CommandError {
    /// The kubeconfig named by `--kubeconfig` could not be read.
    #[error("read the kubeconfig {path}")]
    ReadKubeconfig {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig did not give a usable configuration (context, cluster, user).
    #[error("load the kubeconfig")]
    LoadKubeconfig(#[source] kube::config::KubeconfigError),
    /// Neither a kubeconfig nor an in-cluster configuration was found.
    #[error("find a Kubernetes configuration")]
    InferConfig(#[source] kube::config::InferConfigError),
    /// The client could not be built from the configuration.
    #[error("build the Kubernetes client")]
    BuildClient(#[source] kube::Error),
    /// Reading the EtcdCluster failed.
    #[error("get etcdcluster {name:?}")]
    Get {
        /// The cluster.
        name: String,
        /// The failure.
        #[source]
        source: kube::Error,
    },
    /// Setting the annotation failed.
    #[error("annotate etcdcluster {name:?}")]
    Annotate {
        /// The cluster.
        name: String,
        /// The failure.
        #[source]
        source: kube::Error,
    },
    /// The status says the request cannot be met.
    #[error("check the request against the status of etcdcluster {name:?}")]
    Check {
        /// The cluster.
        name: String,
        /// What is wrong.
        #[source]
        source: RequestError,
    },
    /// The snapshot failed.
    #[error("save the snapshot of etcdcluster {name:?} to {path}")]
    Snapshot {
        /// The cluster.
        name: String,
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: snapshot::SnapshotError,
    },
    /// The cluster reports no client endpoints (yet).
    #[error("etcdcluster {name:?} reports no client endpoints yet (status.clientEndpoints)")]
    NoEndpoints {
        /// The cluster.
        name: String,
    },
    /// Interrupted (Ctrl-C) before the snapshot was whole.
    #[error("interrupted: no snapshot was written")]
    Interrupted,
    /// The confirmation could not be read.
    #[error("read the confirmation from the terminal")]
    ReadAnswer(#[source] std::io::Error),
    /// Writing the output failed.
    #[error("write the output")]
    Output(#[source] std::io::Error),
    /// A disruptive request was not confirmed, or would have no effect: nothing changed.
    #[error("{reason}")]
    Refused {
        /// Why.
        reason: String,
    },
}

impl CommandError {
    fn exit_code(&self) -> u8 {
        match self {
            Self::Refused { .. } => EXIT_REFUSED,
            _ => EXIT_ERROR,
        }
    }
}

/// The line printed after `error: `, as kubectl prints it: an API error is the server's own
/// message (`etcdclusters.etcd.operator.dev "x" not found`); anything else is the chain of what
/// failed and why.
fn report(error: &CommandError) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(kube::Error::Api(status)) = e.downcast_ref::<kube::Error>() {
            return status.message.clone();
        }
        if let Some(snapshot::SnapshotError::Refused { message, .. }) =
            e.downcast_ref::<snapshot::SnapshotError>()
        {
            return message.clone();
        }
        source = e.source();
    }
    etcd_operator_api::report::chain(error)
}

/// The client, the namespace to use, and the kubeconfig file in use (for `endpoints`).
struct Connection {
    client: kube::Client,
    namespace: String,
    kubeconfig: Option<PathBuf>,
}

/// The kubeconfig file kubectl would read: `--kubeconfig`, else the first of `$KUBECONFIG`, else
/// `~/.kube/config`.
fn kubeconfig_path(global: &Global) -> Option<PathBuf> {
    if let Some(p) = &global.kubeconfig {
        return Some(p.clone());
    }
    if let Some(list) = std::env::var_os("KUBECONFIG") {
        return std::env::split_paths(&list).find(|p| !p.as_os_str().is_empty());
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube").join("config"))
}

async fn connect(global: &Global) -> Result<Connection, CommandError> {
    let options = kube::config::KubeConfigOptions {
        context: global.context.clone(),
        cluster: None,
        user: None,
    };
    let config = if let Some(path) = &global.kubeconfig {
        let file =
            kube::config::Kubeconfig::read_from(path).map_err(|source| CommandError::ReadKubeconfig {
                path: path.clone(),
                source,
            })?;
        kube::Config::from_custom_kubeconfig(file, &options)
            .await
            .map_err(CommandError::LoadKubeconfig)?
    } else if global.context.is_some() {
        kube::Config::from_kubeconfig(&options)
            .await
            .map_err(CommandError::LoadKubeconfig)?
    } else {
        kube::Config::infer().await.map_err(CommandError::InferConfig)?
    };
    let namespace = global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).map_err(CommandError::BuildClient)?;
    Ok(Connection {
        client,
        namespace,
        kubeconfig: kubeconfig_path(global),
    })
}

fn out(text: &str) -> Result<(), CommandError> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(CommandError::Output)
}

fn note(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

async fn get(api: &Api<EtcdCluster>, name: &str) -> Result<EtcdCluster, CommandError> {
    api.get(name).await.map_err(|source| CommandError::Get {
        name: name.to_owned(),
        source,
    })
}

async fn annotate(api: &Api<EtcdCluster>, name: &str, request: &Request) -> Result<(), CommandError> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(request.merge_patch()),
    )
    .await
    .map_err(|source| CommandError::Annotate {
        name: name.to_owned(),
        source,
    })?;
    out(&format!(
        "etcdcluster.etcd.operator.dev/{name} annotated {}={}: {}\n",
        request.key, request.value, request.effect
    ))
}

fn check<T>(name: &str, result: Result<T, RequestError>) -> Result<T, CommandError> {
    result.map_err(|source| CommandError::Check {
        name: name.to_owned(),
        source,
    })
}

async fn run(cli: Cli) -> Result<(), CommandError> {
    let conn = connect(&cli.global).await?;
    let api: Api<EtcdCluster> = Api::namespaced(conn.client.clone(), &conn.namespace);
    let now = jiff::Timestamp::now();
    match cli.command {
        Command::Status { name } => {
            let cluster = get(&api, &name).await?;
            out(&render::status(
                &conn.namespace,
                &name,
                cluster.status.as_ref(),
                now,
            ))
        }
        Command::Snapshot {
            name,
            output,
            allow_unverified,
        } => {
            let save = snapshot::save(
                &conn.client,
                &conn.namespace,
                &name,
                &output,
                allow_unverified,
                std::io::stderr().is_terminal(),
            );
            // Ctrl-C drops the download, and with it the temporary file: nothing is left behind.
            let saved = tokio::select! {
                saved = save => saved.map_err(|source| CommandError::Snapshot {
                    name: name.clone(),
                    path: output.clone(),
                    source,
                })?,
                _ = tokio::signal::ctrl_c() => return Err(CommandError::Interrupted),
            };
            if !saved.verified {
                note("warning: the server sent no SHA-256: the snapshot is unverified");
            }
            out(&format!(
                "Snapshot of etcdcluster {name} saved to {} ({} bytes, revision {}, sha256 {}{})\n",
                output.display(),
                saved.size,
                saved.revision.as_deref().unwrap_or("unknown"),
                saved.sha256,
                if saved.verified { ", verified" } else { "" },
            ))
        }
        Command::Defrag { name } => {
            get(&api, &name).await?;
            annotate(&api, &name, &requests::defragment(now)).await
        }
        Command::ReplaceMember { name, member } => {
            let cluster = get(&api, &name).await?;
            let request = check(
                &name,
                requests::replace_member(&name, cluster.status.as_ref(), &member),
            )?;
            annotate(&api, &name, &request).await
        }
        Command::RotateCerts { name } => {
            let cluster = get(&api, &name).await?;
            let request = check(&name, requests::rotate_certificates(&cluster, &name, now))?;
            annotate(&api, &name, &request).await
        }
        Command::MoveLeader { name, member } => {
            let cluster = get(&api, &name).await?;
            match check(
                &name,
                requests::move_leader(&name, cluster.status.as_ref(), &member, now),
            )? {
                Some(request) => annotate(&api, &name, &request).await,
                None => out(&format!(
                    "member {member} already leads etcdcluster {name}: nothing to do\n"
                )),
            }
        }
        Command::RecoverQuorum { name, survivor, yes } => {
            let cluster = get(&api, &name).await?;
            let plan = check(
                &name,
                requests::recover_quorum(&name, cluster.status.as_ref(), survivor.as_deref()),
            )?;
            note(plan.describe(&name).trim_end());
            let confirmation = requests::confirmation(yes, std::io::stdin().is_terminal());
            if confirmation == Confirmation::NoTerminal {
                return Err(CommandError::Refused {
                    reason: format!(
                        "not confirmed: standard input is not a terminal to ask on; pass --yes to recover the quorum of etcdcluster {name:?} (nothing was changed)"
                    ),
                });
            }
            if plan.has_quorum {
                return Err(CommandError::Refused {
                    reason: format!(
                        "etcdcluster {name:?} has quorum (condition Available is True): the operator would not act on the request now, and it would wait on the object until quorum is lost; nothing was changed"
                    ),
                });
            }
            if confirmation == Confirmation::Ask {
                {
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "Type \"yes\" to recover the quorum of etcdcluster {name}: ");
                    let _ = err.flush();
                }
                let mut answer = String::new();
                std::io::stdin()
                    .read_line(&mut answer)
                    .map_err(CommandError::ReadAnswer)?;
                if !requests::confirms(&answer) {
                    return Err(CommandError::Refused {
                        reason: "not confirmed: nothing was changed".to_owned(),
                    });
                }
            }
            annotate(&api, &name, &plan.request).await
        }
        Command::Endpoints { name, pki_dir } => {
            let cluster = get(&api, &name).await?;
            let endpoints = cluster
                .status
                .as_ref()
                .and_then(|s| s.client_endpoints.clone())
                .unwrap_or_default();
            if endpoints.is_empty() {
                return Err(CommandError::NoEndpoints { name });
            }
            let files = if env::uses_tls(&endpoints) {
                let dir = pki_dir.or_else(|| {
                    conn.kubeconfig
                        .as_deref()
                        .and_then(|k| env::local_pki_dir(k, &conn.namespace, &name))
                });
                let files = dir.as_deref().map(env::ClientFiles::in_pki_dir);
                match files {
                    Some(f) if f.paths().iter().all(|p| p.is_file()) => Some(f),
                    _ => {
                        note(&format!(
                            "warning: the client plane of etcdcluster {name} uses TLS and needs a client certificate of its client CA; \
                             none was found (--pki-dir names a directory with client-trust.crt, operator.crt and operator.key; \
                             in Kubernetes issue one from the Secret {name}-client-ca, see docs/tls.md)"
                        ));
                        None
                    }
                }
            } else {
                None
            };
            out(&env::render(&endpoints, files.as_ref()))
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            note(&format!("error: start the async runtime: {e}"));
            return ExitCode::from(EXIT_ERROR);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            note(&format!("error: {}", report(&e)));
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_errors_read_as_kubectl_prints_them() {
        let status =
            kube::core::Status::failure(r#"etcdclusters.etcd.operator.dev "x" not found"#, "NotFound")
                .with_code(404);
        let e = CommandError::Get {
            name: "x".into(),
            source: kube::Error::Api(Box::new(status)),
        };
        assert_eq!(report(&e), r#"etcdclusters.etcd.operator.dev "x" not found"#);
        assert_eq!(e.exit_code(), EXIT_ERROR);
    }

    #[test]
    fn other_errors_print_what_failed_and_why() {
        let e = CommandError::Check {
            name: "d".into(),
            source: RequestError::NoTls { cluster: "d".into() },
        };
        assert_eq!(
            report(&e),
            r#"check the request against the status of etcdcluster "d": etcdcluster "d" uses no TLS (spec.tls is empty): there are no certificates to rotate"#
        );
        let refused = CommandError::Refused {
            reason: "not confirmed".into(),
        };
        assert_eq!(refused.exit_code(), EXIT_REFUSED);
    }

    #[test]
    fn the_kubeconfig_flag_comes_first() {
        let g = Global {
            kubeconfig: Some("/x/kubeconfig".into()),
            ..Global::default()
        };
        assert_eq!(kubeconfig_path(&g), Some(PathBuf::from("/x/kubeconfig")));
    }
}
