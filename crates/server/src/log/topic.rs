//! What a node checks of its brokers and its topic before it reads it, at
//! start and in `pollbox check-config`: that every broker name resolves and
//! one of them answers (each failure its own message, within seconds rather
//! than a client's generic transport error after its timeouts), that the
//! topic exists, and that its settings can keep what was acknowledged
//! ([`TopicSettings::unsafe_settings`], the core's rule).
//!
//! What it is not: the reading of records (`consume.rs`).

use super::topic_id::{self, IdError, TopicId};
use pollbox_core::config::LogConfig;
use pollbox_core::log::{TopicSettings, UnsafeSetting};
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use std::fmt;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long one broker is given to accept a TCP connection.
const CONNECT: Duration = Duration::from_secs(2);
/// One metadata or configuration request.
const REQUEST: Duration = Duration::from_secs(5);

/// Why the log cannot be read (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogProblem {
    /// `log.brokers` names nothing usable.
    NoBrokers,
    /// A broker's host name does not resolve.
    Unresolved { broker: String, why: String },
    /// No broker accepted a connection: each with its reason.
    Unreachable(Vec<(String, String)>),
    /// The brokers answer, and the topic is not there.
    MissingTopic { topic: String },
    /// The brokers answered something else that stops the check.
    Broker(String),
    /// The topic can lose acknowledged records.
    Unsafe {
        topic: String,
        found: Vec<UnsafeSetting>,
    },
}

impl LogProblem {
    /// Whether the node refuses to start (a setting to fix, not a broker
    /// to wait for).
    pub(crate) fn is_fatal(&self) -> bool {
        matches!(self, LogProblem::Unsafe { .. } | LogProblem::NoBrokers)
    }
}

impl fmt::Display for LogProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogProblem::NoBrokers => write!(f, "log.brokers names no host:port"),
            LogProblem::Unresolved { broker, why } => write!(
                f,
                "the broker host of {broker} does not resolve ({why}): check the name in log.brokers and this machine's DNS"
            ),
            LogProblem::Unreachable(all) => {
                write!(f, "no broker accepts a connection:")?;
                for (b, why) in all {
                    write!(f, " {b} ({why})")?;
                }
                write!(f, "; check log.brokers' ports and that the brokers run")
            }
            LogProblem::MissingTopic { topic } => write!(
                f,
                "topic {topic} does not exist on these brokers: create it with its final partition count, e.g. kafka-topics.sh --create --topic {topic} --partitions 4 --replication-factor 3 --config min.insync.replicas=2"
            ),
            LogProblem::Broker(why) => write!(f, "{why}"),
            LogProblem::Unsafe { topic, found } => {
                write!(f, "topic {topic} can lose acknowledged records:")?;
                for (i, s) in found.iter().enumerate() {
                    write!(f, "{} {s}", if i == 0 { "" } else { ";" })?;
                }
                write!(
                    f,
                    ". Fix the topic, or set log.allow_unsafe_topic = true (development only)"
                )
            }
        }
    }
}

/// The brokers of `log.brokers`, as `host:port` (a `PROTOCOL://` prefix
/// taken off).
fn brokers(list: &str) -> Vec<&str> {
    list.split(',')
        .map(str::trim)
        .filter(|b| !b.is_empty())
        .map(|b| b.rsplit_once("://").map_or(b, |(_, rest)| rest))
        .collect()
}

/// Every broker name resolves and at least one broker accepts a TCP
/// connection.
pub(crate) fn reach(list: &str) -> Result<(), LogProblem> {
    let all = brokers(list);
    if all.is_empty() {
        return Err(LogProblem::NoBrokers);
    }
    let mut refused = Vec::new();
    for b in all {
        let addrs: Vec<SocketAddr> = match b.to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                return Err(LogProblem::Unresolved {
                    broker: b.to_string(),
                    why: e.to_string(),
                })
            }
        };
        let mut last = "no address".to_string();
        for a in &addrs {
            match TcpStream::connect_timeout(a, CONNECT) {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
        }
        refused.push((b.to_string(), last));
    }
    Err(LogProblem::Unreachable(refused))
}

/// What the brokers say of `topic`: its partition count, settings and id.
#[derive(Debug, Clone)]
pub struct TopicInfo {
    pub partitions: usize,
    pub settings: TopicSettings,
    /// None: the brokers give no topic ids (older than Kafka 2.8).
    pub(crate) id: Option<TopicId>,
}

/// Ask the brokers about `cfg.topic` (after [`reach`]).
pub(crate) fn describe(cfg: &LogConfig) -> Result<TopicInfo, LogProblem> {
    let admin: AdminClient<DefaultClientContext> = super::client_config(cfg)
        .create()
        .map_err(|e| LogProblem::Broker(format!("cannot create the Kafka client: {e}")))?;
    let md = admin
        .inner()
        .fetch_metadata(Some(&cfg.topic), REQUEST)
        .map_err(|e| LogProblem::Broker(format!("reading the topic's metadata: {e}")))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == cfg.topic)
        .ok_or_else(|| LogProblem::MissingTopic {
            topic: cfg.topic.clone(),
        })?;
    match t.error() {
        None => {}
        Some(rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => {
            return Err(LogProblem::MissingTopic {
                topic: cfg.topic.clone(),
            })
        }
        Some(e) => return Err(LogProblem::Broker(format!("topic {}: {e:?}", cfg.topic))),
    }
    if t.partitions().is_empty() {
        return Err(LogProblem::MissingTopic {
            topic: cfg.topic.clone(),
        });
    }
    let replication_factor = t
        .partitions()
        .iter()
        .map(|p| p.replicas().len() as u32)
        .min()
        .unwrap_or(0);
    let opts = AdminOptions::new().request_timeout(Some(REQUEST));
    let spec = ResourceSpecifier::Topic(&cfg.topic);
    let described = futures_executor::block_on(admin.describe_configs([&spec], &opts))
        .map_err(|e| LogProblem::Broker(format!("reading the topic's configuration: {e}")))?;
    let resource = described
        .into_iter()
        .next()
        .ok_or_else(|| LogProblem::Broker("the brokers described no topic".into()))?
        .map_err(|e| LogProblem::Broker(format!("reading the topic's configuration: {e:?}")))?;
    let value = |name: &str| -> Option<String> { resource.get(name).and_then(|e| e.value.clone()) };
    let settings = TopicSettings {
        replication_factor,
        // Kafka's own defaults where the broker does not say.
        min_insync_replicas: value("min.insync.replicas")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1),
        unclean_leader_election: value("unclean.leader.election.enable")
            .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        cleanup_policy: value("cleanup.policy").unwrap_or_else(|| "delete".into()),
    };
    let id = match topic_id::describe(&admin, &cfg.topic, REQUEST) {
        Ok(id) => id,
        Err(IdError::NoTopic) => {
            return Err(LogProblem::MissingTopic {
                topic: cfg.topic.clone(),
            })
        }
        Err(IdError::Failed(why)) => {
            return Err(LogProblem::Broker(format!("reading the topic's id: {why}")))
        }
    };
    Ok(TopicInfo {
        partitions: t.partitions().len(),
        settings,
        id,
    })
}

/// The whole check: the brokers reached, the topic there, its settings
/// safe (or let through by `log.allow_unsafe_topic`, which the caller says).
pub fn check(cfg: &LogConfig) -> Result<TopicInfo, LogProblem> {
    reach(&cfg.brokers)?;
    let info = describe(cfg)?;
    let found = info.settings.unsafe_settings();
    if !found.is_empty() && !cfg.allow_unsafe_topic {
        return Err(LogProblem::Unsafe {
            topic: cfg.topic.clone(),
            found,
        });
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_lists_are_split_and_protocols_taken_off() {
        assert_eq!(
            brokers(" a:9092, SASL_SSL://b:9093 ,,c:1"),
            ["a:9092", "b:9093", "c:1"]
        );
        assert!(brokers(" , ").is_empty());
    }

    #[test]
    fn a_name_that_does_not_resolve_and_a_closed_port_are_told_apart() {
        let e = reach("no-such-host.invalid:9092").unwrap_err();
        assert!(matches!(e, LogProblem::Unresolved { .. }), "{e}");
        assert!(e.to_string().contains("does not resolve"), "{e}");
        // A port nothing listens on: bind one, then close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = reach(&format!("127.0.0.1:{port}")).unwrap_err();
        assert!(matches!(e, LogProblem::Unreachable(_)), "{e}");
        assert!(e.to_string().contains("no broker accepts"), "{e}");
        assert_eq!(reach(""), Err(LogProblem::NoBrokers));
    }
}
