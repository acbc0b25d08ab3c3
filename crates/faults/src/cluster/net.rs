//! The cluster's networks: every broker and node in a network namespace of
//! its own, wired by veth pairs to three bridges, so that a cut is a link
//! taken down and packets really are dropped:
//!
//! - `k`, the Kafka clients' network: the suite (root namespace), brokers'
//!   client listeners, nodes' Kafka clients;
//! - `r`, the brokers' own network: replication and the KRaft quorum;
//! - `h`, HTTP: the suite (workload, HAProxy) and the nodes' listeners.
//!
//! Cutting a node off from the brokers takes down its `k` link (its HTTP
//! side still answers); cutting a broker off from the other brokers takes
//! down its `r` link (clients still reach it). A link is taken down on the
//! bridge's side: the namespace's end loses its carrier and drops what it
//! sends, the bridge drops what is sent to it. Neighbours are permanent, so
//! the cut is silence (timeouts), not "no route to host".
//!
//! A run holds a slot (`/run/pollbox-faults/slotN.lock`, flock): its names
//! (`pfN-...`) and addresses (10.231.4N+net.host) are its own, and a slot
//! left by a run that died is cleaned before it is used again.

use super::process::run;
use std::collections::BTreeSet;
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::Mutex;

/// One of the three networks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lan {
    Kafka,
    Replication,
    Http,
}

impl Lan {
    fn index(self) -> u8 {
        match self {
            Lan::Kafka => 0,
            Lan::Replication => 1,
            Lan::Http => 2,
        }
    }
    fn letter(self) -> char {
        match self {
            Lan::Kafka => 'k',
            Lan::Replication => 'r',
            Lan::Http => 'h',
        }
    }
}

/// A host of the cluster: its namespace and the networks it is on.
#[derive(Debug, Clone)]
pub struct Host {
    /// Short name: `b1`..`b3`, `a`, `b`, `c`.
    pub name: String,
    pub octet: u8,
    pub lans: Vec<Lan>,
}

pub struct Net {
    pub slot: u8,
    _lock: File,
    hosts: Vec<Host>,
    cut: Mutex<BTreeSet<(String, Lan)>>,
}

const ROOT_OCTET: u8 = 1;

fn ip(args: &[&str]) -> Result<String, String> {
    let mut c = Command::new("ip");
    c.args(args);
    run(&format!("ip {}", args.join(" ")), c)
}

impl Net {
    /// Take a free slot and build the networks for `hosts`.
    pub fn create(hosts: Vec<Host>) -> Result<Net, String> {
        let dir = "/run/pollbox-faults";
        std::fs::create_dir_all(dir).map_err(|e| format!("{dir}: {e}"))?;
        let mut taken = None;
        for slot in 0..60u8 {
            let path = format!("{dir}/slot{slot}.lock");
            let f = File::create(&path).map_err(|e| format!("{path}: {e}"))?;
            // SAFETY: flock(2) on a file descriptor we own and keep open.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                taken = Some((slot, f));
                break;
            }
        }
        let (slot, lock) = taken.ok_or("no free slot in /run/pollbox-faults")?;
        let net = Net {
            slot,
            _lock: lock,
            hosts,
            cut: Mutex::new(BTreeSet::new()),
        };
        net.clean();
        net.build()?;
        Ok(net)
    }

    /// What every name of this slot starts with (`pf3-`).
    fn prefix(&self) -> String {
        format!("pf{}-", self.slot)
    }

    /// The namespace of a host.
    pub fn ns(&self, host: &str) -> String {
        format!("{}{host}", self.prefix())
    }

    fn bridge(&self, lan: Lan) -> String {
        format!("{}{}", self.prefix(), lan.letter())
    }

    fn veth(&self, host: &str, lan: Lan) -> String {
        format!("{}{host}{}", self.prefix(), lan.letter())
    }

    /// A host's address on a network.
    pub fn addr(&self, octet: u8, lan: Lan) -> Ipv4Addr {
        Ipv4Addr::new(10, 231, self.slot * 4 + lan.index(), octet)
    }

    /// The suite's own address on a network (`k` and `h` only).
    pub fn root_addr(&self, lan: Lan) -> Ipv4Addr {
        self.addr(ROOT_OCTET, lan)
    }

    fn mac(&self, octet: u8, lan: Lan) -> String {
        format!(
            "02:a7:{:02x}:{:02x}:00:{:02x}",
            self.slot,
            lan.index(),
            octet
        )
    }

    fn lans_of_root() -> [Lan; 2] {
        [Lan::Kafka, Lan::Http]
    }

    /// Remove what a dead run left in this slot: processes in its
    /// namespaces (they were that run's), the namespaces, the links.
    fn clean(&self) {
        let prefix = self.prefix();
        if let Ok(list) = ip(&["netns", "list"]) {
            for line in list.lines() {
                let name = line.split_whitespace().next().unwrap_or("");
                if name.starts_with(&prefix) {
                    if let Ok(pids) = ip(&["netns", "pids", name]) {
                        for pid in pids
                            .split_whitespace()
                            .filter_map(|p| p.parse::<i32>().ok())
                        {
                            // SAFETY: kill(2) of a process in a namespace of
                            // this slot, which only a run of this suite makes.
                            unsafe { libc::kill(pid, libc::SIGKILL) };
                        }
                    }
                    let _ = ip(&["netns", "del", name]);
                }
            }
        }
        for lan in [Lan::Kafka, Lan::Replication, Lan::Http] {
            let _ = ip(&["link", "del", &self.bridge(lan)]);
        }
        if let Ok(links) = ip(&["-o", "link", "show"]) {
            for line in links.lines() {
                if let Some(name) = line.split(": ").nth(1) {
                    let name = name.split('@').next().unwrap_or("");
                    if name.starts_with(&prefix) {
                        let _ = ip(&["link", "del", name]);
                    }
                }
            }
        }
    }

    fn build(&self) -> Result<(), String> {
        for lan in [Lan::Kafka, Lan::Replication, Lan::Http] {
            let br = self.bridge(lan);
            ip(&["link", "add", &br, "type", "bridge"])?;
            ip(&["link", "set", &br, "address", &self.mac(ROOT_OCTET, lan)])?;
            if Self::lans_of_root().contains(&lan) {
                let a = format!("{}/24", self.root_addr(lan));
                ip(&["addr", "add", &a, "dev", &br])?;
            }
            ip(&["link", "set", &br, "up"])?;
        }
        for h in &self.hosts {
            let ns = self.ns(&h.name);
            ip(&["netns", "add", &ns])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            for &lan in &h.lans {
                let outer = self.veth(&h.name, lan);
                let inner = format!("{}0", lan.letter());
                ip(&[
                    "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &ns,
                ])?;
                ip(&[
                    "-n",
                    &ns,
                    "link",
                    "set",
                    &inner,
                    "address",
                    &self.mac(h.octet, lan),
                ])?;
                let a = format!("{}/24", self.addr(h.octet, lan));
                ip(&["-n", &ns, "addr", "add", &a, "dev", &inner])?;
                ip(&["-n", &ns, "link", "set", &inner, "up"])?;
                ip(&["link", "set", &outer, "master", &self.bridge(lan), "up"])?;
            }
        }
        // Permanent neighbours: a cut host is silent, not unreachable.
        for lan in [Lan::Kafka, Lan::Replication, Lan::Http] {
            let mut members: Vec<(Option<String>, u8)> = self
                .hosts
                .iter()
                .filter(|h| h.lans.contains(&lan))
                .map(|h| (Some(self.ns(&h.name)), h.octet))
                .collect();
            if Self::lans_of_root().contains(&lan) {
                members.push((None, ROOT_OCTET));
            }
            for (ns, octet) in &members {
                let dev = match ns {
                    Some(_) => format!("{}0", lan.letter()),
                    None => self.bridge(lan),
                };
                for (_, peer) in members.iter().filter(|(_, o)| o != octet) {
                    let addr = self.addr(*peer, lan).to_string();
                    let mac = self.mac(*peer, lan);
                    let mut args: Vec<&str> = Vec::new();
                    if let Some(ns) = ns {
                        args.extend(["-n", ns.as_str()]);
                    }
                    args.extend([
                        "neigh",
                        "replace",
                        &addr,
                        "lladdr",
                        &mac,
                        "dev",
                        &dev,
                        "nud",
                        "permanent",
                    ]);
                    ip(&args)?;
                }
            }
        }
        Ok(())
    }

    /// Take down a host's link to a network: packets to and from it drop.
    pub fn cut(&self, host: &str, lan: Lan) -> Result<(), String> {
        ip(&["link", "set", &self.veth(host, lan), "down"])?;
        self.cut
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((host.to_string(), lan));
        Ok(())
    }

    /// Bring a host's link back.
    pub fn heal(&self, host: &str, lan: Lan) -> Result<(), String> {
        ip(&["link", "set", &self.veth(host, lan), "up"])?;
        self.cut
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(host.to_string(), lan));
        Ok(())
    }

    /// Bring every cut link back.
    pub fn heal_all(&self) {
        let cut: Vec<(String, Lan)> = self
            .cut
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        for (h, lan) in cut {
            let _ = self.heal(&h, lan);
        }
    }

    /// A command to run in a host's namespace (`ip netns exec` execs it, so
    /// the child's pid is the program's).
    pub fn command(&self, host: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(host), program]);
        c
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.clean();
    }
}
