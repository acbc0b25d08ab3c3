//! The cluster under test, on this machine: three Kafka brokers, pollbox
//! nodes `a` and `b` (and `c`, started from nothing at the end), HAProxy in
//! front of `a` and `b`, each broker and node in its own network namespace
//! ([`net`]). Everything it starts is its child and dies with it.
//!
//! What it is not: the nemesis. It offers the levers (kill, signal, cut,
//! move a leader); [`crate::nemesis`] decides when to pull them.

pub mod haproxy;
pub mod kafka;
pub mod net;
pub mod node;
pub mod process;

use kafka::{Brokers, Jvm};
use net::{Host, Lan, Net};
use node::Node;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The node that starts from nothing once faults stopped and replays the
/// whole topic.
pub const REPLAY_NODE: &str = "c";

pub const TOPIC: &str = "faults";
pub const PARTITIONS: i32 = 4;

/// Where things are.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The repository (scripts/kafka, deploy/haproxy).
    pub repo: PathBuf,
    /// The pollbox binary (a release build).
    pub pollbox: PathBuf,
    /// The run's folder: brokers' data and logs, nodes' configs, snapshots
    /// and logs, HAProxy's log.
    pub dir: PathBuf,
}

pub struct Cluster {
    pub net: Net,
    pub brokers: Brokers,
    /// a, b; then c once [`Cluster::start_replay_node`] ran.
    pub nodes: Vec<Node>,
    pub haproxy: Option<haproxy::Haproxy>,
    pub layout: Layout,
}

fn say(what: &str) {
    eprintln!("pollbox-faults: {what}");
}

impl Cluster {
    pub fn start(layout: Layout) -> Result<Cluster, String> {
        let mut hosts: Vec<Host> = (0..kafka::BROKERS)
            .map(|i| Host {
                name: Brokers::host(i),
                octet: Brokers::octet(i),
                lans: vec![Lan::Kafka, Lan::Replication],
            })
            .collect();
        for n in ["a", "b", "c"] {
            hosts.push(Host {
                name: n.to_string(),
                octet: Node::octet(n),
                lans: vec![Lan::Kafka, Lan::Http],
            });
        }
        let net = Net::create(hosts)?;
        say(&format!("networks of slot {} ready", net.slot));
        let jvm = Jvm::find(&layout.repo)?;
        let brokers = Brokers::start(&net, jvm, &layout.dir.join("kafka"))?;
        say(&format!("3 brokers started ({})", brokers.bootstrap));
        brokers.create_topic(TOPIC, PARTITIONS)?;
        brokers.wait_in_sync(TOPIC, Duration::from_secs(60))?;
        say(&format!(
            "topic {TOPIC}: {PARTITIONS} partitions, replication factor 3, min.insync.replicas 2"
        ));
        let mut nodes = Vec::new();
        for n in ["a", "b"] {
            let node = Node::new(
                &net,
                n,
                &layout.pollbox,
                &layout.dir.join("nodes"),
                &brokers.bootstrap,
                TOPIC,
            )?;
            node.start(&net)?;
            nodes.push(node);
        }
        for n in &nodes {
            n.wait_ready(Duration::from_secs(60))?;
        }
        say("nodes a and b ready");
        let haproxy =
            haproxy::Haproxy::start(&layout.repo, &layout.dir, [nodes[0].addr, nodes[1].addr])?;
        say(&format!("haproxy on {}", haproxy.addr));
        Ok(Cluster {
            net,
            brokers,
            nodes,
            haproxy: Some(haproxy),
            layout,
        })
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .expect("a node of the cluster")
    }

    /// Start node [`REPLAY_NODE`] with no snapshot: it replays the whole topic.
    pub fn start_replay_node(&mut self) -> Result<&Node, String> {
        let node = Node::new(
            &self.net,
            REPLAY_NODE,
            &self.layout.pollbox,
            &self.layout.dir.join("nodes"),
            &self.brokers.bootstrap,
            TOPIC,
        )?;
        let _ = std::fs::remove_file(node.dir.join("boxes.snap"));
        node.start(&self.net)?;
        self.nodes.push(node);
        Ok(self.nodes.last().expect("pushed"))
    }

    /// Stop everything it started; the networks go with [`Net`]'s drop.
    pub fn stop(&mut self) {
        if let Some(mut h) = self.haproxy.take() {
            h.stop();
        }
        self.net.heal_all();
        std::thread::scope(|s| {
            for n in &self.nodes {
                s.spawn(move || n.stop());
            }
        });
        self.brokers.stop_all();
    }

    /// Remove the brokers' data (keeping their logs) and the snapshots.
    pub fn remove_data(dir: &Path) {
        for i in 0..kafka::BROKERS {
            let _ = std::fs::remove_dir_all(dir.join("kafka").join(Brokers::host(i)).join("data"));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}
