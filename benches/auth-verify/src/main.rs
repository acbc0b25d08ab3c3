//! µs per verification of one token per algorithm, with jsonwebtoken (what
//! pollbox uses) and jwt-simple: `cargo run --release` here.

use std::time::Instant;
use serde::Deserialize;

#[derive(Deserialize, serde::Serialize, Clone, Debug)]
struct Scope { #[serde(default)] read: Vec<String>, #[serde(default)] write: Vec<String> }
#[derive(Deserialize, serde::Serialize, Clone, Debug)]
struct Pb { pollbox: Option<Scope>, exp: Option<u64> }
#[derive(Deserialize, serde::Serialize, Clone, Debug)]
struct PbS { pollbox: Option<Scope> }

fn b64(s: &str) -> Vec<u8> {
    use jsonwebtoken::jwk::*; let _ = std::marker::PhantomData::<Jwk>;
    let mut out = Vec::new();
    let t: Vec<u8> = s.bytes().map(|c| match c { b'A'..=b'Z'=>c-b'A', b'a'..=b'z'=>c-b'a'+26, b'0'..=b'9'=>c-b'0'+52, b'-'=>62, b'_'=>63, _=>panic!() }).collect();
    for ch in t.chunks(4) { let mut v=0u32; for (i,&x) in ch.iter().enumerate(){ v |= (x as u32) << (18-6*i);} let n = ch.len()*6/8; for i in 0..n { out.push((v >> (16-8*i)) as u8);} }
    out
}

fn main() {
    // The fixtures of pollbox-core's unit tests (made by crates/server/tests/mint_jwt.py).
    let dir = std::env::args().nth(1).unwrap_or("../../crates/core/src/auth/testdata".into());
    let jwks: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(format!("{dir}/jwks.json")).unwrap()).unwrap();
    let all: std::collections::HashMap<String, String> = serde_json::from_str(&std::fs::read_to_string(format!("{dir}/tokens.json")).unwrap()).unwrap();
    let tokens: Vec<String> = ["hs_far", "es_far", "ed_far", "rs_far"].iter().map(|k| all[*k].clone()).collect();
    let keys = jwks["keys"].as_array().unwrap();
    let n = 2000;
    // jsonwebtoken
    let set: jsonwebtoken::jwk::JwkSet = serde_json::from_value(jwks.clone()).unwrap();
    for (i, alg) in [jsonwebtoken::Algorithm::HS256, jsonwebtoken::Algorithm::ES256, jsonwebtoken::Algorithm::EdDSA, jsonwebtoken::Algorithm::RS256].into_iter().enumerate() {
        let key = jsonwebtoken::DecodingKey::from_jwk(&set.keys[i]).unwrap();
        let mut v = jsonwebtoken::Validation::new(alg);
        v.validate_exp = false; v.required_spec_claims.clear(); v.validate_aud = false;
        let r = jsonwebtoken::decode::<Pb>(&tokens[i], &key, &v).unwrap();
        assert!(r.claims.pollbox.is_some());
        let iters = if i == 0 { n * 20 } else { n };
        let t = Instant::now();
        for _ in 0..iters { std::hint::black_box(jsonwebtoken::decode::<Pb>(&tokens[i], &key, &v).unwrap()); }
        println!("jsonwebtoken {alg:?}: {:.1} us", t.elapsed().as_secs_f64() * 1e6 / iters as f64);
    }
    // jwt-simple
    use jwt_simple::prelude::*;
    let opts = VerificationOptions { artificial_time: Some(Duration::from_secs(1_800_000_000)), ..Default::default() };
    let hs = HS256Key::from_bytes(&b64(keys[0]["k"].as_str().unwrap()));
    let mut sec1 = vec![4u8]; sec1.extend(b64(keys[1]["x"].as_str().unwrap())); sec1.extend(b64(keys[1]["y"].as_str().unwrap()));
    let es = ES256PublicKey::from_bytes(&sec1).unwrap();
    let ed = Ed25519PublicKey::from_bytes(&b64(keys[2]["x"].as_str().unwrap())).unwrap();
    let rs = RS256PublicKey::from_components(&b64(keys[3]["n"].as_str().unwrap()), &b64(keys[3]["e"].as_str().unwrap())).unwrap();
    macro_rules! run { ($name:expr, $k:expr, $tok:expr, $iters:expr) => {{
        $k.verify_token::<PbS>($tok, Some(opts.clone())).unwrap();
        let t = Instant::now();
        for _ in 0..$iters { std::hint::black_box($k.verify_token::<PbS>($tok, Some(opts.clone())).unwrap()); }
        println!("jwt-simple {}: {:.1} us", $name, t.elapsed().as_secs_f64() * 1e6 / $iters as f64);
    }}}
    run!("HS256", hs, &tokens[0], n*20);
    run!("ES256", es, &tokens[1], n);
    run!("EdDSA", ed, &tokens[2], n);
    run!("RS256", rs, &tokens[3], n);
}
