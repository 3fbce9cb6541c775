//! The setup of a test with Curator processes: the compiled program, a standalone
//! server and one lock name with the directory Curator is given.

use lock_core::LockName;
use lock_zookeeper::lock_dir;

use super::{ZkFactory, BASE};

/// What a test with Curator processes needs: the compiled program, a standalone server,
/// and one lock name without `/` with its directory `<base>/<name>`, the path Curator is
/// given.
pub struct CuratorSetup {
    /// Holds the compiled program.
    _classes: tempfile::TempDir,
    classpath: String,
    /// The server.
    pub factory: ZkFactory,
    /// The lock name.
    pub name: LockName,
    /// Its directory.
    pub path: String,
}

impl CuratorSetup {
    /// Compiles the program and starts the server; `None` (after a loud notice) when
    /// java, the Curator jars or ZooKeeper are missing and strict mode is off.
    pub async fn start(tag: &str) -> Option<Self> {
        let classes = tempfile::tempdir().expect("temp dir");
        let classpath = harness::curator::compile(classes.path()).await?;
        let factory = ZkFactory::start().await?;
        let name = LockName::new(format!("curator-{tag}-{}", uuid::Uuid::new_v4().simple()))
            .expect("valid");
        let path = lock_dir(BASE, &name);
        Some(CuratorSetup {
            _classes: classes,
            classpath,
            factory,
            name,
            path,
        })
    }

    /// A Curator process on the lock's path, ready.
    pub async fn curator(&self) -> harness::curator::Curator {
        let connect = self.factory.servers.hosts().join(",");
        harness::curator::Curator::start(&self.classpath, &connect, &self.path)
            .await
            .expect("curator starts")
    }
}

impl std::fmt::Debug for CuratorSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CuratorSetup")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}
