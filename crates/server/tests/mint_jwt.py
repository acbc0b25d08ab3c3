#!/usr/bin/env python3
"""Keys and tokens for pollbox's auth tests, made with PyJWT and `cryptography`
(an implementation independent of the one pollbox verifies with).

  mint_jwt.py keys DIR
      Writes DIR/jwks.json (the public key set pollbox reads: one key per
      algorithm, kids "hs", "es", "ed", "rs"; the oct key holds its secret) and
      DIR/private.json (what `mint` signs with).

  mint_jwt.py mint DIR < SPECS
      SPECS: a JSON array; each element mints one token, printed one a line:
      {"kid": "es", "claims": {...}}                 signed with that kid's key
      {"kid": "es", "alg": "HS256", "key": "hs"}     header alg/kid, signed with another key
      {"alg": "none", "claims": {...}}               unsigned (alg "none")
      {"kid": "es", "claims": {...}, "tamper": true} signature bytes flipped
      {"kid": "es", "no_kid": true, ...}             no kid in the header
"""
import base64
import json
import os
import sys

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

ALGS = {"hs": "HS256", "es": "ES256", "ed": "EdDSA", "rs": "RS256"}


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def pem(key):
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def keys(d):
    os.makedirs(d, exist_ok=True)
    secret = os.urandom(32)
    es = ec.generate_private_key(ec.SECP256R1())
    ed = ed25519.Ed25519PrivateKey.generate()
    rs = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    es_pub = es.public_key().public_numbers()
    ed_pub = ed.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    rs_pub = rs.public_key().public_numbers()
    n_bytes = rs_pub.n.to_bytes((rs_pub.n.bit_length() + 7) // 8, "big")
    jwks = {
        "keys": [
            {"kty": "oct", "kid": "hs", "k": b64(secret)},
            {
                "kty": "EC",
                "crv": "P-256",
                "kid": "es",
                "x": b64(es_pub.x.to_bytes(32, "big")),
                "y": b64(es_pub.y.to_bytes(32, "big")),
            },
            {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": b64(ed_pub)},
            {"kty": "RSA", "kid": "rs", "n": b64(n_bytes), "e": b64(b"\x01\x00\x01")},
        ]
    }
    private = {"hs": b64(secret), "es": pem(es), "ed": pem(ed), "rs": pem(rs)}
    with open(os.path.join(d, "jwks.json"), "w") as f:
        json.dump(jwks, f, indent=1)
    with open(os.path.join(d, "private.json"), "w") as f:
        json.dump(private, f)


def signing_key(private, kid):
    if kid == "hs":
        return base64.urlsafe_b64decode(private["hs"] + "==")
    return serialization.load_pem_private_key(private[kid].encode(), None)


def mint_one(private, spec):
    claims = spec.get("claims", {})
    alg = spec.get("alg") or ALGS[spec["kid"]]
    if alg == "none":
        header = {"alg": "none", "typ": "JWT"}
        if "kid" in spec:
            header["kid"] = spec["kid"]
        body = json.dumps(claims, separators=(",", ":")).encode()
        return b64(json.dumps(header).encode()) + "." + b64(body) + "."
    key_id = spec.get("key", spec.get("kid"))
    key = signing_key(private, key_id)
    if alg == "HS256" and key_id != "hs":
        # A public key used as an HMAC secret: the classic confusion attack.
        # PyJWT refuses to do it, so it is signed by hand with hmac.
        import hashlib
        import hmac

        pub = json.load(open(private["_dir"] + "/jwks.json"))
        secret = json.dumps(pub).encode()
        header = {"alg": "HS256", "typ": "JWT", "kid": spec.get("kid", key_id)}
        signing_input = (
            b64(json.dumps(header).encode())
            + "."
            + b64(json.dumps(claims, separators=(",", ":")).encode())
        )
        sig = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
        return signing_input + "." + b64(sig)
    headers = {} if spec.get("no_kid") else {"kid": spec["kid"]}
    token = jwt.encode(claims, key, algorithm=alg, headers=headers)
    if spec.get("no_kid"):
        # PyJWT adds nothing itself; make sure no kid is there.
        pass
    if spec.get("tamper"):
        head, body, sig = token.split(".")
        raw = bytearray(base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)))
        raw[len(raw) // 2] ^= 0x01
        token = head + "." + body + "." + b64(bytes(raw))
    return token


def mint(d, specs):
    private = json.load(open(os.path.join(d, "private.json")))
    private["_dir"] = d
    for spec in specs:
        print(mint_one(private, spec))


if __name__ == "__main__":
    if sys.argv[1] == "keys":
        keys(sys.argv[2])
    elif sys.argv[1] == "mint":
        mint(sys.argv[2], json.load(sys.stdin))
    else:
        sys.exit("usage: mint_jwt.py keys DIR | mint DIR < SPECS")
