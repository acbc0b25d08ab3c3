use super::*;
use pollbox_core::config::Config;

/// A running two-worker server without a log, and its rendered exposition.
fn exposition() -> (crate::Server, String) {
    let mut c = Config::embedded();
    c.server.listen = "127.0.0.1:0".into();
    c.server.workers = 2;
    let server = crate::Server::start(c).expect("server starts");
    let mut out = Vec::new();
    server.render_metrics(&mut out);
    (server, String::from_utf8(out).expect("UTF-8"))
}

/// The series name and the label names of a sample line.
fn series(line: &str) -> (&str, Vec<&str>) {
    let (series, _value) = line.rsplit_once(' ').expect("a value");
    let Some((name, labels)) = series.split_once('{') else {
        return (series, Vec::new());
    };
    let labels = labels.strip_suffix('}').expect("labels closed");
    let names = labels
        .split(',')
        .map(|kv| kv.split_once("=\"").expect("label=\"value\"").0)
        .collect();
    (name, names)
}

#[test]
fn family_names_are_unique() {
    for (i, f) in FAMILIES.iter().enumerate() {
        assert!(
            FAMILIES[..i].iter().all(|g| g.name != f.name),
            "{} declared twice",
            f.name
        );
    }
}

#[test]
fn every_declared_family_is_rendered_once_with_its_help_type_and_labels() {
    let (server, text) = exposition();
    let scrape = Scrape::new(&server.shared);
    let lines: Vec<&str> = text.lines().collect();
    for family in FAMILIES {
        let help = format!("# HELP {} {}", family.name, family.help);
        let kind = format!("# TYPE {} {}", family.name, family.kind.name());
        let at: Vec<usize> = (0..lines.len()).filter(|&i| lines[i] == help).collect();
        let declared = lines
            .iter()
            .filter(|l| l.starts_with(&format!("# HELP {} ", family.name)))
            .count();
        if !family.shown(&scrape) {
            assert_eq!(declared, 0, "{} shown on a node without it", family.name);
            continue;
        }
        assert_eq!((at.len(), declared), (1, 1), "{}: {help:?}", family.name);
        assert_eq!(lines[at[0] + 1], kind, "{}", family.name);
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.starts_with(&format!("# TYPE {} ", family.name)))
                .count(),
            1,
            "{}",
            family.name
        );
    }
    // Every line is a header of a declared family, or a sample of the family
    // whose header came last, with the declared label names.
    let mut current: Option<&Family> = None;
    for line in &lines {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            current = FAMILIES.iter().find(|f| f.name == name);
            assert!(current.is_some(), "{name} is not declared");
            continue;
        }
        if line.starts_with("# TYPE ") {
            continue;
        }
        let family = current.expect("a sample after a header");
        let (name, labels) = series(line);
        match family.kind {
            Kind::Histogram => {
                let suffix = name.strip_prefix(family.name).unwrap_or_default();
                match suffix {
                    "_bucket" => assert_eq!(labels, ["le"], "{line}"),
                    "_sum" | "_count" => assert!(labels.is_empty(), "{line}"),
                    _ => panic!("{line} is not a sample of {}", family.name),
                }
            }
            Kind::Counter | Kind::Gauge => {
                assert_eq!(name, family.name, "{line}");
                assert_eq!(labels, family.labels, "{line}");
            }
        }
    }
}

#[test]
fn per_worker_families_have_one_sample_per_worker() {
    let (_server, text) = exposition();
    for family in FAMILIES.iter().filter(|f| f.labels == ["worker"]) {
        let samples: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{}{{", family.name)))
            .collect();
        assert_eq!(samples.len(), 2, "{}: {samples:?}", family.name);
        assert!(samples[0].starts_with(&format!("{}{{worker=\"0\"}} ", family.name)));
        assert!(samples[1].starts_with(&format!("{}{{worker=\"1\"}} ", family.name)));
    }
}
