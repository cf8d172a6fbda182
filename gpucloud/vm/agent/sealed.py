"""Secrets sealed to one node's key, so no channel object, user-data or manifest holds them in
plain text (docs/DATA.md, "Secrets").

The node already has an Ed25519 key made at boot that never leaves it (claim.py); the CLI learns
its public half from the node's claim. An Ed25519 key pair maps to an X25519 one (RFC 7748
section 4.1 birational map; the scalar is the clamped first half of SHA-512 of the seed, as in
RFC 8032), so the CLI seals to the claimed key with an ephemeral X25519 key and only the node can
open it. The stdlib has neither X25519 nor AES, and this module runs on both sides (the CLI and
the VM agent, Python >= 3.8, stdlib only), so: X25519 by the RFC's Montgomery ladder, keys by
HMAC-SHA256 extraction/expansion (HKDF, RFC 5869), the payload XORed with an HMAC-SHA256 counter
keystream and authenticated by HMAC-SHA256 over everything (encrypt-then-MAC). Sizes are small
(a few KiB of env values), so speed does not matter.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import Tuple

P = 2**255 - 19
A24 = 121665
MAGIC = b"gpucloud-sealed-1"
NONCE_LEN = 16
TAG_LEN = 32
SEALED_MAX = 64 * 1024 * 1024  # what the node reads of a sealed object (data grants: ~1 KiB a file)


class SealError(ValueError):
    """The object is not one sealed to this key (tampered, truncated, or for another node)."""


def _clamp(k: bytes) -> int:
    b = bytearray(k[:32])
    b[0] &= 248
    b[31] &= 127
    b[31] |= 64
    return int.from_bytes(bytes(b), "little")


def x25519(scalar: bytes, u: bytes) -> bytes:
    """RFC 7748 X25519(k, u): the Montgomery ladder, constant in its steps (not in Python's ints)."""
    k = _clamp(scalar)
    x1 = int.from_bytes(u[:32], "little") & ((1 << 255) - 1)
    x2, z2, x3, z3, swap = 1, 0, x1, 1, 0
    for t in range(254, -1, -1):
        bit = (k >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % P, (x2 - z2) % P
        aa, bb = a * a % P, b * b % P
        e = (aa - bb) % P
        c, d = (x3 + z3) % P, (x3 - z3) % P
        da, cb = d * a % P, c * b % P
        x3 = (da + cb) ** 2 % P
        z3 = x1 * (da - cb) ** 2 % P
        x2 = aa * bb % P
        z2 = e * (aa + A24 * e) % P
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, P - 2, P) % P).to_bytes(32, "little")


def x25519_public(scalar: bytes) -> bytes:
    return x25519(scalar, (9).to_bytes(32, "little"))


def ed25519_public_to_x25519(ed_pub: bytes) -> bytes:
    """The Montgomery u of an Edwards point: u = (1 + y) / (1 - y) mod p."""
    if len(ed_pub) != 32:
        raise SealError("an Ed25519 public key is 32 bytes")
    y = int.from_bytes(ed_pub, "little") & ((1 << 255) - 1)
    if y >= P or (1 - y) % P == 0:
        raise SealError("not a usable Ed25519 public key")
    return ((1 + y) * pow((1 - y) % P, P - 2, P) % P).to_bytes(32, "little")


def ed25519_seed_to_x25519(seed: bytes) -> bytes:
    """The X25519 scalar of an Ed25519 private key (its 32-byte seed): SHA-512(seed)[:32]."""
    return hashlib.sha512(seed).digest()[:32]


def seed_from_pem(pem: str) -> bytes:
    """The 32-byte seed of an Ed25519 PKCS#8 PEM (what `openssl genpkey -algorithm ed25519` writes)."""
    body = "".join(line.strip() for line in pem.splitlines() if line.strip() and not line.startswith("-----"))
    der = base64.b64decode(body)
    # PKCS#8 v1 for Ed25519: 48 bytes, the seed is the trailing OCTET STRING of 32 bytes.
    if len(der) < 34 or der[-34:-32] != b"\x04\x20":
        raise SealError("not an Ed25519 private key")
    return der[-32:]


def _keys(shared: bytes, eph_pub: bytes, node_pub: bytes) -> Tuple[bytes, bytes]:
    prk = hmac.new(MAGIC, shared + eph_pub + node_pub, hashlib.sha256).digest()
    return (
        hmac.new(prk, b"enc\x01", hashlib.sha256).digest(),
        hmac.new(prk, b"mac\x01", hashlib.sha256).digest(),
    )


def _stream(key: bytes, nonce: bytes, data: bytes) -> bytes:
    out = bytearray()
    for i in range(0, len(data), 32):
        block = hmac.new(key, nonce + (i // 32).to_bytes(8, "big"), hashlib.sha256).digest()
        out += bytes(x ^ block[j] for j, x in enumerate(data[i : i + 32]))
    return bytes(out)


def seal(ed_pub_b64: str, plaintext: bytes) -> bytes:
    """`plaintext` sealed to the node whose claim is `ed_pub_b64` (base64 of its raw Ed25519 key)."""
    node_pub = ed25519_public_to_x25519(base64.b64decode(ed_pub_b64))
    eph = os.urandom(32)
    eph_pub = x25519_public(eph)
    shared = x25519(eph, node_pub)
    if shared == bytes(32):
        raise SealError("the node's key is a low-order point")
    enc, mac = _keys(shared, eph_pub, node_pub)
    nonce = os.urandom(NONCE_LEN)
    body = MAGIC + eph_pub + nonce + _stream(enc, nonce, plaintext)
    return body + hmac.new(mac, body, hashlib.sha256).digest()


def open_sealed(seed: bytes, blob: bytes) -> bytes:
    """The plaintext of `blob`, opened with the node's Ed25519 seed; SealError when it is not ours."""
    head = len(MAGIC) + 32 + NONCE_LEN
    if len(blob) < head + TAG_LEN or not blob.startswith(MAGIC):
        raise SealError("not a sealed object")
    scalar = ed25519_seed_to_x25519(seed)
    node_pub = x25519_public(scalar)
    eph_pub = blob[len(MAGIC) : len(MAGIC) + 32]
    nonce = blob[len(MAGIC) + 32 : head]
    shared = x25519(scalar, eph_pub)
    enc, mac = _keys(shared, eph_pub, node_pub)
    body, tag = blob[:-TAG_LEN], blob[-TAG_LEN:]
    if not hmac.compare_digest(hmac.new(mac, body, hashlib.sha256).digest(), tag):
        raise SealError("sealed to another key, or changed on the way")
    return _stream(enc, nonce, blob[head:-TAG_LEN])
