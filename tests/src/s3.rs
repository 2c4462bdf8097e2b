//! An S3-compatible server (moto) on a free loopback port, for backup tests.

use std::process::Command;
use std::time::{Duration, Instant};

use object_store::aws::{AmazonS3, AmazonS3Builder};

use crate::process::{SpawnError, TestProcess};
use crate::tools::{self, MissingTool};

const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Credentials the test server accepts (moto accepts any; these are what clients are given).
pub const ACCESS_KEY: &str = "test-access-key";
/// See [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "test-secret-key";
/// The region clients are configured with.
pub const REGION: &str = "us-east-1";

/// Starting or using the S3 server failed.
#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    /// moto is not installed.
    #[error(transparent)]
    Missing(#[from] MissingTool),
    /// Ports or the temporary directory could not be set up.
    #[error("prepare S3 server")]
    Prepare(#[from] std::io::Error),
    /// The process could not be started.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The server did not answer in time or exited.
    #[error("S3 server did not become ready: {reason}; log tail:\n{log}")]
    NotReady { reason: String, log: String },
    /// Creating a bucket failed.
    #[error("create bucket {bucket}: {reason}")]
    CreateBucket { bucket: String, reason: String },
    /// Building an object_store client failed.
    #[error("build S3 client")]
    Client(#[from] object_store::Error),
}

/// A running moto S3 server owned by a test.
#[derive(Debug)]
pub struct S3Server {
    endpoint: String,
    http: reqwest::Client,
    process: TestProcess,
    _dir: tempfile::TempDir,
}

impl S3Server {
    /// Starts the server and waits until it answers.
    pub async fn start() -> Result<Self, S3Error> {
        let binary = tools::moto_server()?;
        let dir = tempfile::Builder::new().prefix("s3-test-").tempdir()?;
        let port = crate::ports::free_ports(1)?[0];
        let mut cmd = Command::new(binary);
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        let process = TestProcess::spawn("moto_server", cmd, &dir.path().join("moto.log"))?;
        let mut server = Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            process,
            _dir: dir,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    async fn wait_ready(&mut self) -> Result<(), S3Error> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut reason = String::from("no attempt yet");
        while Instant::now() < deadline {
            if let Some(status) = self.process.exited() {
                return Err(S3Error::NotReady {
                    reason: format!("exited: {status}"),
                    log: self.process.log_tail(4000),
                });
            }
            match self.http.get(&self.endpoint).send().await {
                Ok(resp) if resp.status().is_success() => return Ok(()),
                Ok(resp) => reason = format!("status {}", resp.status()),
                Err(e) => reason = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(S3Error::NotReady {
            reason,
            log: self.process.log_tail(4000),
        })
    }

    /// The endpoint URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Kills the server (to test an unreachable bucket); the endpoint stays reserved to nobody.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Creates a bucket (a path-style `PUT /<bucket>`).
    pub async fn create_bucket(&self, bucket: &str) -> Result<(), S3Error> {
        let resp = self
            .http
            .put(format!("{}/{bucket}", self.endpoint))
            .send()
            .await
            .map_err(|e| S3Error::CreateBucket {
                bucket: bucket.into(),
                reason: e.to_string(),
            })?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(S3Error::CreateBucket {
                bucket: bucket.into(),
                reason: format!("status {}", resp.status()),
            })
        }
    }

    /// An object_store client for `bucket` on this server (path-style, plain HTTP).
    pub fn store(&self, bucket: &str) -> Result<AmazonS3, S3Error> {
        Ok(AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
            .with_region(REGION)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_bucket_name(bucket)
            .build()?)
    }
}
