#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target (fuzz/corpus/<target>/) from the test suite.

Run from anywhere: python3 fuzz/seed_corpus.py

What it reads: the JSON objects the tests build with `json!({...})` (only the ones written
as literals: a `json!` that interpolates Rust values is skipped), and the label selectors,
field selectors and CEL rules the tests use. From those it writes, per target, inputs in
the target's format (see each target's doc comment): bodies as JSON, YAML and Kubernetes
protobuf (encoded with the schema table `crates/setpoint-protobuf/src/schema.rs` generates),
patches, selector lines, stored objects and store operations.

The output is deterministic, and small: at most PER_TARGET files per target, none larger
than MAX_BYTES. Seeds are named by the SHA-1 of their content, as libFuzzer names what it
adds, so running this again over a corpus the fuzzer grew only adds files.
"""

import base64
import datetime
import hashlib
import json
import pathlib
import random
import re
import struct
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "fuzz" / "corpus"
PER_TARGET = 48
MAX_BYTES = 4096


# --- reading the tests -------------------------------------------------------------------


def source_files():
    for pattern in ("crates/*/tests/*.rs", "crates/*/src/**/*.rs", "examples/*/tests/*.rs"):
        for p in sorted(ROOT.glob(pattern)):
            if "schema.rs" in p.name or "docs.rs" == p.name:
                continue
            yield p


def balanced(text, start):
    """The text of the bracketed group that opens at text[start], strings respected."""
    close = {"(": ")", "[": "]", "{": "}"}
    stack = []
    i = start
    in_str = False
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in close:
            stack.append(close[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return text[start : i + 1]
        i += 1
    return None


TRAILING_COMMA = re.compile(r",(\s*[}\]])")


def json_literals(text):
    """The values of the `json!(...)` macros in `text` that are plain JSON."""
    for m in re.finditer(r"json!\s*\(", text):
        group = balanced(text, m.end() - 1)
        if not group:
            continue
        body = group[1:-1].strip()
        body = TRAILING_COMMA.sub(r"\1", body)
        try:
            yield json.loads(body)
        except ValueError:
            continue


def string_literals(text, pattern):
    for m in re.finditer(pattern, text):
        try:
            yield json.loads('"' + m.group(1) + '"')
        except ValueError:
            continue


def collect():
    values, labels, fields, rules = [], [], [], []
    for p in source_files():
        text = p.read_text(errors="replace")
        values.extend(json_literals(text))
        labels.extend(string_literals(text, r'LabelSelector::parse\(\s*"((?:[^"\\]|\\.)*)"'))
        fields.extend(string_literals(text, r'FieldSelector::parse\(\s*"((?:[^"\\]|\\.)*)"'))
        rules.extend(string_literals(text, r'"rule":\s*"((?:[^"\\]|\\.)*)"'))
        rules.extend(string_literals(text, r'rule:\s*"((?:[^"\\]|\\.)*)"'))
        # Inside a Rust string: \"rule\": \"...\"
        for m in re.finditer(r'\\"rule\\":\s*\\"(.*?)\\"', text):
            rules.append(m.group(1).replace("\\\\", "\\"))
        for m in re.finditer(r"labelSelector=([^&\"\s]+)", text):
            labels.append(urllib.parse.unquote_plus(m.group(1)))
        for m in re.finditer(r"fieldSelector=([^&\"\s]+)", text):
            fields.append(urllib.parse.unquote_plus(m.group(1)))

    def walk(v):
        if isinstance(v, dict):
            r = v.get("rule")
            if isinstance(r, str):
                rules.append(r)
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for v in values:
        walk(v)
    return values, uniq(labels), uniq(fields), uniq(rules)


def uniq(xs):
    seen, out = set(), []
    for x in xs:
        key = json.dumps(x, sort_keys=True) if not isinstance(x, (bytes, str)) else x
        if key not in seen:
            seen.add(key)
            out.append(x)
    return out


# --- protobuf, driven by the generated schema table ---------------------------------------

MESSAGE = re.compile(r'Message \{ name: "([^"]+)", special: Special::(\w+), fields: &\[')
FIELD = re.compile(r'f\((\d+), "([^"]+)", (M\((\d+)\)|\w+), (\w+), \w+\)')
KIND = re.compile(r'Kind \{ group: "([^"]*)", version: "([^"]+)", kind: "([^"]+)", message: (\d+) \}')


def load_schema():
    text = (ROOT / "crates/setpoint-protobuf/src/schema.rs").read_text()
    messages = []
    for chunk in text.split("    Message { ")[1:]:
        m = MESSAGE.match("Message { " + chunk)
        if not m:
            continue
        fields = []
        for f in FIELD.finditer(chunk.split("] },")[0]):
            ty = ("M", int(f.group(4))) if f.group(4) else f.group(3)
            fields.append((int(f.group(1)), f.group(2), ty, f.group(5)))
        messages.append((m.group(1), m.group(2), fields))
    kinds = {(g, v, k): int(i) for g, v, k, i in KIND.findall(text)}
    return messages, kinds


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def key(tag, wire):
    return varint(tag << 3 | wire)


def ld(tag, payload):
    return key(tag, 2) + varint(len(payload)) + payload


def parse_time(s):
    try:
        t = datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(t.timestamp()), t.microsecond * 1000


class Encoder:
    def __init__(self, messages):
        self.messages = messages

    def scalar(self, tag, ty, v):
        if ty == "Str" and isinstance(v, str):
            return ld(tag, v.encode())
        if ty == "Bytes" and isinstance(v, str):
            try:
                return ld(tag, base64.b64decode(v, validate=True))
            except ValueError:
                return b""
        if ty == "Bool" and isinstance(v, bool):
            return key(tag, 0) + varint(int(v))
        if ty in ("I32", "I64") and isinstance(v, int) and not isinstance(v, bool):
            return key(tag, 0) + varint(v)
        if ty == "F64" and isinstance(v, (int, float)) and not isinstance(v, bool):
            return key(tag, 1) + struct.pack("<d", float(v))
        return b""

    def value(self, tag, ty, v):
        if isinstance(ty, tuple):
            payload = self.message(ty[1], v)
            return ld(tag, payload) if payload is not None else b""
        return self.scalar(tag, ty, v)

    def message(self, index, v):
        """The bytes of message `index` holding JSON value `v`; None when `v` does not fit."""
        name, special, fields = self.messages[index]
        if special == "Quantity":
            return ld(1, str(v).encode()) if isinstance(v, (str, int, float)) else None
        if special == "IntOrString":
            if isinstance(v, int) and not isinstance(v, bool):
                return key(1, 0) + varint(0) + key(2, 0) + varint(v)
            if isinstance(v, str):
                return key(1, 0) + varint(1) + ld(3, v.encode())
            return None
        if special in ("Time", "MicroTime"):
            t = parse_time(v) if isinstance(v, str) else None
            if t is None:
                return None
            return key(1, 0) + varint(t[0]) + key(2, 0) + varint(t[1])
        if special == "RawJson":
            return ld(1, json.dumps(v, separators=(",", ":")).encode())
        if special != "None" or not isinstance(v, dict):
            return None
        out = b""
        for tag, jname, ty, card in fields:
            if card == "Inline" and isinstance(ty, tuple):
                payload = self.message(ty[1], v)
                if payload:
                    out += ld(tag, payload)
                continue
            if jname not in v:
                continue
            fv = v[jname]
            if card == "Repeated" and isinstance(fv, list):
                for item in fv:
                    out += self.value(tag, ty, item)
            elif card == "Map" and isinstance(fv, dict):
                for k, item in fv.items():
                    out += ld(tag, ld(1, k.encode()) + self.value(2, ty, item))
            elif card == "Single":
                out += self.value(tag, ty, fv)
        return out


def protobuf_body(encoder, kinds, obj):
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return None
    group, _, version = api_version.rpartition("/")
    index = kinds.get((group, version, kind))
    if index is None:
        return None
    raw = encoder.message(index, obj)
    if raw is None:
        return None
    type_meta = ld(1, api_version.encode()) + ld(2, kind.encode())
    unknown = ld(1, type_meta) + ld(2, raw) + ld(3, b"") + ld(4, b"")
    return b"k8s\0" + unknown


# --- YAML (block style; strings quoted as JSON, which YAML reads as double-quoted) --------


def yaml(v, indent=0):
    pad = "  " * indent
    if isinstance(v, dict) and v:
        lines = []
        for k, x in v.items():
            if isinstance(x, (dict, list)) and x:
                lines.append(f"{pad}{json.dumps(k)}:\n{yaml(x, indent + 1)}")
            else:
                lines.append(f"{pad}{json.dumps(k)}: {json.dumps(x)}")
        return "\n".join(lines)
    if isinstance(v, list) and v:
        lines = []
        for x in v:
            if isinstance(x, (dict, list)) and x:
                inner = yaml(x, indent + 1).lstrip()
                lines.append(f"{pad}- {inner}")
            else:
                lines.append(f"{pad}- {json.dumps(x)}")
        return "\n".join(lines)
    return pad + json.dumps(v)


# --- writing -----------------------------------------------------------------------------


def compact(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode()


def write(target, seeds):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    kept = 0
    for s in uniq([bytes(x) for x in seeds if x is not None]):
        if len(s) > MAX_BYTES:
            continue
        (d / hashlib.sha1(s).hexdigest()).write_bytes(s)
        kept += 1
        if kept >= PER_TARGET:
            break
    print(f"{target}: {kept} seeds")


def spread(xs, n):
    """Up to n items spread over xs (deterministic), so every part of the suite is sampled."""
    if len(xs) <= n:
        return list(xs)
    step = len(xs) / n
    return [xs[int(i * step)] for i in range(n)]


FIXTURE_KINDS = ["ConfigMap", "Deployment", "Pod", "Service"]
STORED_PREFIX_KINDS = [
    ("", "Pod"), ("", "Event"), ("", "Node"), ("", "Namespace"), ("", "Secret"),
    ("", "Service"), ("", "ConfigMap"), ("apps", "ReplicaSet"), ("apps", "StatefulSet"),
    ("batch", "Job"), ("example.com", "Widget"),
]


def main():
    values, labels, fields, rules = collect()
    random.seed(1)
    messages, kinds = load_schema()
    encoder = Encoder(messages)
    objects = [v for v in values if isinstance(v, dict) and "kind" in v and "apiVersion" in v]
    with_meta = [v for v in values if isinstance(v, dict) and isinstance(v.get("metadata"), dict)]
    partial = [v for v in values if isinstance(v, dict) and "apiVersion" not in v]
    json_patches = [
        v for v in values
        if isinstance(v, list) and v and all(isinstance(o, dict) and "op" in o for o in v)
    ]
    print(f"from the tests: {len(values)} JSON values, {len(objects)} objects, "
          f"{len(labels)} label selectors, {len(fields)} field selectors, {len(rules)} rules")

    some = spread(objects, PER_TARGET)
    write("body_json", [compact(o) for o in some[:40]]
          + [json.dumps(o, indent=2).encode() for o in some[:4]]
          + [b'{"a":1,"a":{"b":[1,2,{"c":null}],"b":true}}', b'[1, 2.5e3, "\\u00e9", null]'])
    write("body_yaml", [yaml(o).encode() for o in some[:40]]
          + [compact(o) for o in some[:4]]
          + [b"a: 1\na: 2\nb:\n  - x\n  - {c: d, c: e}\n", b"--- !!str 1\n", b"anchors: &a [1]\nuse: *a\n"])
    protobufs = [protobuf_body(encoder, kinds, o) for o in objects]
    protobufs = [p for p in protobufs if p]
    write("body_protobuf", spread(protobufs, PER_TARGET))

    body_seeds = []
    for o in objects:
        kind = o.get("kind")
        if kind not in FIXTURE_KINDS:
            continue
        collection = FIXTURE_KINDS.index(kind)
        validation = random.randrange(3)
        for ct, body in ((0, compact(o)), (1, yaml(o).encode()), (2, protobuf_body(encoder, kinds, o))):
            if body:
                body_seeds.append(bytes([ct | collection << 2 | validation << 4]) + body)
    write("apiserver_body", spread(body_seeds, PER_TARGET))

    patch_seeds = []
    for p in spread(partial, 16):
        patch_seeds.append(bytes([0 | random.randrange(4) << 2]) + compact(p))
        patch_seeds.append(bytes([2 | random.randrange(4) << 2]) + compact(p))
    for p in spread(json_patches, 12):
        patch_seeds.append(bytes([1 | random.randrange(4) << 2]) + compact(p))
    for o in objects:
        if o.get("kind") in FIXTURE_KINDS:
            i = FIXTURE_KINDS.index(o["kind"])
            name = ["cm", "web", "p", "svc"][i]
            meta = o.get("metadata") if isinstance(o.get("metadata"), dict) else {}
            applied = dict(o, metadata=dict(meta, name=name, namespace="default"))
            patch_seeds.append(bytes([3 | i << 2 | random.randrange(2) << 4]) + yaml(applied).encode())
    patch_seeds.append(b"\x06" + b'{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"x"},{"$patch":"delete","name":"sidecar"}]}}}}')
    patch_seeds.append(b"\x06" + b'{"spec":{"template":{"spec":{"$setElementOrder/containers":[{"name":"sidecar"},{"name":"c"}]}}}}')
    write("patch", spread(patch_seeds, PER_TARGET))

    label_sets = []
    for v in with_meta:
        l = v["metadata"].get("labels")
        if isinstance(l, dict) and all(isinstance(x, str) for x in l.values()):
            label_sets.append("\n".join(f"{k}={x}" for k, x in l.items()))
    label_sets = uniq(label_sets) or ["app=web"]
    selector_seeds = []
    for i, l in enumerate(labels):
        f = fields[i % len(fields)] if fields else ""
        selector_seeds.append(f"{l}\n{f}\n{label_sets[i % len(label_sets)]}".encode())
    for f in fields:
        selector_seeds.append(f"\n{f}\nmetadata.name=x".encode())
    for v in values:
        if isinstance(v, dict) and ("matchLabels" in v or "matchExpressions" in v):
            selector_seeds.append(compact(v) + b"\n" + random.choice(label_sets).encode())
    write("selectors", spread(selector_seeds, PER_TARGET))

    cel_seeds = []
    objs = [v for v in values if isinstance(v, dict)] or [{}]
    for i, r in enumerate(rules):
        cel_seeds.append(f"{r}\n".encode() + compact(objs[i * 7 % len(objs)]))
    cel_seeds += [b"self.a.all(x, x > 0)\n{\"a\":[1,2,3]}", b"has(self.x) ? self.x.size() < 3 : true\n{\"x\":\"ab\"}",
                  b"self.m.exists(k, self.m[k] == 'v')\n{\"m\":{\"a\":\"v\"}}", b"self.x == oldSelf.x\n{\"x\":1}",
                  b"timestamp(self.t) < timestamp('2030-01-01T00:00:00Z')\n{\"t\":\"2026-01-01T00:00:00Z\"}",
                  b"self.s.matches('^[a-z]+$') && duration(self.d) > duration('1s')\n{\"s\":\"ab\",\"d\":\"5m\"}"]
    write("cel_rules", spread(cel_seeds, PER_TARGET))

    store_seeds = []
    for o in spread(with_meta, 12):
        store_seeds.append(b"\x00" + compact(o))
    store_seeds.append(b"\x00" + b"\x00" * 40)
    store_seeds.append(b"\x00" + compact(with_meta[0]) * 8 if with_meta else b"\x00{}")
    for i, o in enumerate(spread(with_meta, 8)):
        k = f"/registry/core/pods/default/{o['metadata'].get('name', 'x')}".encode()
        value = compact(o)
        put_row = b"\x01" + struct.pack(">qqI", i + 1, i + 2, len(k)) + k + value
        store_seeds.append(b"\x01" + struct.pack("<q", i + 3) + put_row)
        store_seeds.append(b"\x01" + struct.pack("<q", i + 3) + b"\x02" + k)
    for _ in range(12):
        ops = bytearray()
        for _ in range(random.randrange(4, 24)):
            ops += bytes(random.randrange(256) for _ in range(random.randrange(3, 10)))
        store_seeds.append(b"\x02" + bytes(ops))
    write("store_encoding", store_seeds)

    watch_seeds = []
    for i, o in enumerate(with_meta):
        kind = (o.get("apiVersion", "").rpartition("/")[0], o.get("kind"))
        which = STORED_PREFIX_KINDS.index(kind) if kind in STORED_PREFIX_KINDS else len(STORED_PREFIX_KINDS) - 1
        stored = dict(o, metadata={k: x for k, x in o["metadata"].items() if k != "resourceVersion"})
        l = labels[i % len(labels)] if labels else ""
        f = fields[i % len(fields)] if fields else ""
        watch_seeds.append(bytes([which]) + f"{l}\n{f}\n".encode() + compact(stored))
    write("watchcache_filter", spread(watch_seeds, PER_TARGET))


if __name__ == "__main__":
    main()
