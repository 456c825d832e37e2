#!/usr/bin/env python3
"""Generates `src/schema.rs`, the schema table that drives setpoint-protobuf's decoder, and
`src/docs.rs`, which adds to the same table (same message and field order) what the API server's
OpenAPI documents need: descriptions, required properties and `+listType`/`+listMapKey` markers.

Inputs (nothing is downloaded; everything comes from the local cargo registry):

* the sources of the `k8s-pb` crate (prost-generated Rust for Kubernetes' `generated.proto`):
  every message, its fields, their protobuf types and tag numbers, and their doc comments (the
  Go doc comments of k8s.io/api, i.e. the API's own documentation text);
* the sources of the `k8s-openapi` crate: the exact JSON property names of every type
  (prost snake-cases proto names lossily: `podIPs` becomes `pod_i_ps`), which properties
  are required, and which types are API kinds (`impl Resource`);
* `gen/go-pointer-fields.txt`: which optional scalar fields are Go pointers (see that file).

Both crates are found with `cargo metadata` as the dev-dependencies of setpoint-protobuf;
`--k8s-pb DIR` / `--k8s-openapi DIR` override that.

Usage (from anywhere):  python3 crates/setpoint-protobuf/gen/gen_schema.py [--verbose]
then `cargo test -p setpoint-protobuf`: its whole-table test decodes every field of every kind
and checks that k8s-openapi reads the JSON back. The output is committed; lib.rs declares it
`#[rustfmt::skip]`, so cargo fmt leaves it as generated.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

CRATE_DIR = Path(__file__).resolve().parent.parent

# Messages with hand-written JSON mappings (package key, message name) -> Special variant.
SPECIALS = {
    ("apimachinery.pkg.api.resource", "Quantity"): "Quantity",
    ("apimachinery.pkg.util.intstr", "IntOrString"): "IntOrString",
    ("apimachinery.pkg.apis.meta.v1", "Time"): "Time",
    ("apimachinery.pkg.apis.meta.v1", "MicroTime"): "MicroTime",
    ("apimachinery.pkg.apis.meta.v1", "Duration"): "Duration",
    ("apimachinery.pkg.apis.meta.v1", "FieldsV1"): "RawJson",
    ("apimachinery.pkg.runtime", "RawExtension"): "RawJson",
}
for _v in ("v1", "v1beta1"):
    _p = f"apiextensions_apiserver.pkg.apis.apiextensions.{_v}"
    SPECIALS[(_p, "JSON")] = "RawJson"
    SPECIALS[(_p, "JSONSchemaPropsOrArray")] = "OrArray"
    SPECIALS[(_p, "JSONSchemaPropsOrBool")] = "OrBool"
    SPECIALS[(_p, "JSONSchemaPropsOrStringArray")] = "OrStringArray"

# JSON names that neither k8s-openapi nor a unique global match provides and that camelCasing the
# prost name gets wrong (acronyms). (package key, message, prost field) -> JSON name.
NAME_OVERRIDES = {
    ("api.core.v1", "PodLogOptions", "insecure_skip_tls_verify_backend"): "insecureSkipTLSVerifyBackend",
    ("apiextensions_apiserver.pkg.apis.apiextensions.v1", "ConversionRequest", "desired_api_version"): "desiredAPIVersion",
    ("apiextensions_apiserver.pkg.apis.apiextensions.v1beta1", "ConversionRequest", "desired_api_version"): "desiredAPIVersion",
}

# meta/v1 option kinds are registered in every group version (and in meta.k8s.io/v1).
WILDCARD_KINDS = ["CreateOptions", "DeleteOptions", "GetOptions", "ListOptions", "PatchOptions", "UpdateOptions"]

SCALARS = {"string": "Str", "bytes": "Bytes", "bool": "Bool", "int32": "I32", "int64": "I64", "double": "F64"}


def norm(name: str) -> str:
    """Case-, underscore- and punctuation-insensitive key used to match proto and JSON names."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def camel(snake: str) -> str:
    parts = snake.split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


# ---------------------------------------------------------------------------------------------
# Locating the inputs


def locate_crates() -> tuple[Path, Path]:
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--manifest-path", str(CRATE_DIR / "Cargo.toml")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    meta = json.loads(out)
    by_id = {p["id"]: p for p in meta["packages"]}
    me = next(p for p in meta["packages"] if p["name"] == "setpoint-protobuf")
    node = next(n for n in meta["resolve"]["nodes"] if n["id"] == me["id"])
    found = {}
    for dep in node["deps"]:
        pkg = by_id[dep["pkg"]]
        if pkg["name"] in ("k8s-pb", "k8s-openapi"):
            found[pkg["name"]] = Path(pkg["manifest_path"]).parent
    missing = {"k8s-pb", "k8s-openapi"} - found.keys()
    if missing:
        sys.exit(f"cargo metadata: setpoint-protobuf does not depend on {sorted(missing)}")
    return found["k8s-pb"], found["k8s-openapi"]


# ---------------------------------------------------------------------------------------------
# k8s-pb


@dataclass
class PbField:
    rust: str  # prost field name (snake case, without r#)
    tag: int
    scalar: str | None  # proto scalar type, or None for a message
    msg: tuple[str, str] | None  # (package key, rust struct name) of a message type
    card: str  # "single" | "repeated" | "map"


@dataclass
class PbMessage:
    pkg: str
    rust_name: str
    fields: list[PbField]
    resource: tuple[str, str] | None = None  # (apiVersion, kind) from `impl Resource`


WRAPPERS = [
    "::core::option::Option<",
    "::prost::alloc::vec::Vec<",
    "::prost::alloc::boxed::Box<",
    "::prost::alloc::collections::BTreeMap<",
]


def resolve_path(pkg: str, path: str) -> tuple[str, str]:
    parts = pkg.split(".")
    segs = path.split("::")
    while segs and segs[0] == "super":
        segs.pop(0)
        parts.pop()
    *mods, name = segs
    return ".".join(parts + mods), name


def parse_pb_type(pkg: str, ty: str) -> list[tuple[str, str] | str]:
    """Returns the element types of a prost field type: message refs or the string 'scalar'."""
    t = re.sub(r"\s+", "", ty)
    for w in WRAPPERS:
        t = t.replace(w, "")
    t = t.replace(">", "")
    out: list[tuple[str, str] | str] = []
    for part in t.split(","):
        if part in ("::prost::alloc::string::String", "::prost::alloc::vec::Vec<u8", "::prost::alloc::vec::Vecu8"):
            out.append("scalar")
        elif part in ("bool", "i32", "i64", "f64", "u8"):
            out.append("scalar")
        elif part:
            out.append(resolve_path(pkg, part))
    return out


def parse_k8s_pb(root: Path) -> dict[tuple[str, str], PbMessage]:
    msgs: dict[tuple[str, str], PbMessage] = {}
    src = root / "src"
    for f in sorted(src.rglob("mod.rs")):
        rel = f.relative_to(src).parent
        pkg = ".".join(rel.parts)
        text = f.read_text()
        # Drop doc comments so that field regexes only see code.
        code = "\n".join(line for line in text.splitlines() if not line.strip().startswith("///"))
        for m in re.finditer(r"^pub struct (\w+) \{\n(.*?)^\}", code, re.S | re.M):
            name, body = m.group(1), m.group(2)
            fields = []
            for fm in re.finditer(
                r"#\[prost\(([^\]]*)\)\]\s*pub (?:r#)?(\w+):\s*(.+?),\s*(?=#\[prost|\Z)", body, re.S
            ):
                attr, rust, ty = fm.group(1), fm.group(2), fm.group(3)
                tag = int(re.search(r'tag\s*=\s*"(\d+)"', attr).group(1))
                refs = parse_pb_type(pkg, ty)
                mm = re.match(r'btree_map\s*=\s*"(\w+),\s*(\w+)"', attr)
                if mm:
                    key, val = mm.group(1), mm.group(2)
                    if key != "string":
                        sys.exit(f"{pkg}.{name}.{rust}: map key {key} unsupported")
                    if val == "message":
                        msg = refs[1]
                        assert isinstance(msg, tuple), (pkg, name, rust, ty)
                        fields.append(PbField(rust, tag, None, msg, "map"))
                    else:
                        fields.append(PbField(rust, tag, val, None, "map"))
                    continue
                kind = re.match(r"(\w+)", attr).group(1)
                card = "repeated" if re.search(r"\brepeated\b", attr) else "single"
                if kind == "message":
                    msg = refs[0]
                    assert isinstance(msg, tuple), (pkg, name, rust, ty)
                    fields.append(PbField(rust, tag, None, msg, card))
                elif kind in SCALARS:
                    fields.append(PbField(rust, tag, kind, None, card))
                else:
                    sys.exit(f"{pkg}.{name}.{rust}: unsupported prost attribute {attr!r}")
            msgs[(pkg, name)] = PbMessage(pkg, name, sorted(fields, key=lambda x: x.tag))
        for m in re.finditer(r"^pub struct (\w+) \{\}", code, re.M):
            msgs[(pkg, m.group(1))] = PbMessage(pkg, m.group(1), [])
        for m in re.finditer(
            r"impl crate::Resource for (\w+) \{\s*const API_VERSION: &'static str = \"([^\"]*)\";.*?"
            r"const KIND: &'static str = \"([^\"]*)\";",
            code,
            re.S,
        ):
            msgs[(pkg, m.group(1))].resource = (m.group(2), m.group(3))
    return msgs


def clean_doc(lines: list[str]) -> str:
    """Go doc comment (as prost rendered it) -> the description Kubernetes' OpenAPI carries:
    everything from a `---` line on is internal and dropped, as are `+marker` and one-line `TODO`
    lines; lines are joined with spaces and paragraphs separated by a blank line."""
    paras: list[list[str]] = [[]]
    for line in lines:
        text = line.strip()
        if text.startswith("---"):
            break
        if text.startswith("+") or text.startswith("TODO"):
            continue
        if not text:
            if paras[-1]:
                paras.append([])
            continue
        # prost wraps bare URLs in <...> and escapes brackets for rustdoc; undo both.
        text = re.sub(r"<((?:https?|ftp)://[^>\s]+)>", r"\1", text)
        text = text.replace("\\[", "[").replace("\\]", "]")
        paras[-1].append(text)
    return "\n\n".join(" ".join(p) for p in paras if p)


def parse_k8s_pb_docs(root: Path) -> dict[tuple[str, str, str | None], str]:
    """Doc comments of k8s-pb: (package key, struct, None) -> struct doc and
    (package key, struct, prost field) -> field doc."""
    docs: dict[tuple[str, str, str | None], str] = {}
    src = root / "src"
    for f in sorted(src.rglob("mod.rs")):
        pkg = ".".join(f.relative_to(src).parent.parts)
        pending: list[str] = []
        struct: str | None = None
        for line in f.read_text().splitlines():
            s = line.strip()
            if s.startswith("///"):
                pending.append(s[3:])
                continue
            if s.startswith("#["):
                continue
            sm = re.match(r"pub struct (\w+) \{", s)
            if sm and not line.startswith(" "):
                struct = sm.group(1)
                docs[(pkg, struct, None)] = clean_doc(pending)
            elif struct is not None and line.startswith("    pub "):
                fm = re.match(r"pub (?:r#)?(\w+):", s)
                if fm:
                    docs[(pkg, struct, fm.group(1))] = clean_doc(pending)
                    list_type = [m for p in pending for m in re.findall(r"^\s*\+listType=(\w+)", p)]
                    if list_type:
                        keys = [m for p in pending for m in re.findall(r"^\s*\+listMapKey=(\w+)", p)]
                        docs[("list", pkg, struct, fm.group(1))] = (list_type[0], keys)
            elif line.startswith("}"):
                struct = None
            pending = []
    return docs


# ---------------------------------------------------------------------------------------------
# k8s-openapi


@dataclass
class OaType:
    definition: str
    json_by_norm: dict[str, str] = field(default_factory=dict)
    required: set[str] = field(default_factory=set)  # JSON names of non-Option fields
    # Required in the newest Kubernetes version only (what OpenAPI `required` lists).
    required_now: set[str] = field(default_factory=set)
    resource: tuple[str, str] | None = None


def openapi_key(definition: str) -> tuple[str, str]:
    d = definition.removeprefix("io.k8s.").replace("-", "_")
    pkg, _, name = d.rpartition(".")
    return pkg, name


def parse_k8s_openapi(root: Path) -> dict[tuple[str, str], OaType]:
    """Newest Kubernetes version first; older versions only add types the newer ones lack."""
    types: dict[tuple[str, str], OaType] = {}
    vdirs = sorted(
        (d for d in (root / "src").iterdir() if re.fullmatch(r"v1_\d+", d.name)),
        key=lambda d: int(d.name.split("_")[1]),
        reverse=True,
    )
    for vdir in vdirs:
        for f in sorted(vdir.rglob("*.rs")):
            text = f.read_text()
            m = re.match(r"// Generated from definition (\S+)", text)
            if not m:
                continue
            key = openapi_key(m.group(1))
            if key in types:
                # Older versions only contribute required-ness: a property that was required
                # (Go: no `omitempty`) and later merely documented as optional still has no
                # `omitempty`, so Go keeps writing its zero value.
                for rm in re.finditer(r"^    pub (\w+): (.+),$", text, re.M):
                    if not rm.group(2).startswith("Option<"):
                        js = next((j for j, r in re.findall(r'"([^"]+)" => Field::Key_(\w+),', text) if r == rm.group(1)), None)
                        if js:
                            types[key].required.add(js)
                continue
            t = OaType(m.group(1))
            sm = re.search(r"^pub struct \w+ \{(.*?)^\}", text, re.S | re.M)
            rust_types = {}
            if sm:
                for fm in re.finditer(r"^    pub (\w+): (.+),$", sm.group(1), re.M):
                    rust_types[fm.group(1)] = fm.group(2)
            for fm in re.finditer(r'"([^"]+)" => Field::Key_(\w+),', text):
                js, rust = fm.group(1), fm.group(2)
                t.json_by_norm[norm(js)] = js
                rt = rust_types.get(rust, "Option<")
                if not rt.startswith("Option<"):
                    t.required.add(js)
                    t.required_now.add(js)
            rm = re.search(
                r"impl crate::Resource for \w+ \{\s*const API_VERSION: &'static str = \"([^\"]*)\";.*?"
                r"const KIND: &'static str = \"([^\"]*)\";",
                text,
                re.S,
            )
            if rm:
                t.resource = (rm.group(1), rm.group(2))
            types[key] = t
    return types


# ---------------------------------------------------------------------------------------------
# Go pointer data


def parse_pointer_file(path: Path) -> tuple[set[str], dict[tuple[str, str], dict[str, str]]]:
    """Returns (covered package keys, {(pkg, GoStruct): {norm(json or Go field): source text}})."""
    covered: set[str] = set()
    pointers: dict[tuple[str, str], dict[str, str]] = {}
    pkg = None
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        pm = re.fullmatch(r"\[(\S+)\]", line)
        if pm:
            gopath = pm.group(1)
            gopath = gopath.removeprefix("k8s.io/").replace("-", "_")
            pkg = ".".join(gopath.split("/"))
            covered.add(pkg)
            continue
        sm = re.fullmatch(r"(\w+):\s*(.*)", line)
        if not sm or pkg is None:
            sys.exit(f"{path}:{lineno}: cannot parse {raw!r}")
        entry = pointers.setdefault((pkg, sm.group(1)), {})
        for fname in sm.group(2).split():
            # `GoName=jsonName` when the Go field name is not the JSON name.
            entry[norm(fname.split("=")[-1])] = f"{path.name}:{lineno}: {sm.group(1)}.{fname}"
    return covered, pointers


# ---------------------------------------------------------------------------------------------
# Building the table


@dataclass
class OutField:
    tag: int
    json: str
    ty: str
    card: str
    presence: str


@dataclass
class OutMessage:
    name: str
    special: str
    fields: list[OutField]
    required: list[str] = field(default_factory=list)  # OpenAPI `required` (JSON names)


def inlinable(pb, msg_key, parent: OaType) -> bool:
    """Whether every field of message `msg_key` (recursively through its own embedded structs) is a
    JSON property of `parent`: the proto field holds a Go struct embedded with `json:",inline"`."""
    fields = pb[msg_key].fields
    return bool(fields) and all(
        norm(sf.rust) in parent.json_by_norm
        or (sf.msg is not None and sf.card == "single" and inlinable(pb, sf.msg, parent))
        for sf in fields
    )


def build(pb, oa, covered, pointers):
    warnings: list[str] = []
    keys = sorted(pb.keys())
    index = {k: i for i, k in enumerate(keys)}
    if len(keys) > 65535:
        sys.exit("too many messages for u16 indices")

    # Match every prost struct to its k8s-openapi type (prost renames JSONSchemaProps -> JsonSchemaProps).
    # Types that k8s-openapi lacks (old beta versions, lists, admission, metrics, ...) borrow the
    # property names of the same type in another version of the same group, if there is one.
    oa_by_lower = {(p, n.lower()): (n, t) for (p, n), t in oa.items()}
    oa_by_group = {}
    for (p, n), t in sorted(oa.items(), reverse=True):
        oa_by_group.setdefault((p.rsplit(".", 1)[0], n.lower()), (n, t))
    global_names: dict[str, set[str]] = {}
    for t in oa.values():
        for n, js in t.json_by_norm.items():
            global_names.setdefault(n, set()).add(js)
    proto_name: dict[tuple[str, str], str] = {}
    oa_of: dict[tuple[str, str], OaType | None] = {}
    own_oa: dict[tuple[str, str], OaType | None] = {}
    for k in keys:
        hit = oa_by_lower.get((k[0], k[1].lower()))
        own_oa[k] = hit[1] if hit else None
        if hit is None:
            hit = oa_by_group.get((k[0].rsplit(".", 1)[0], k[1].lower()))
        proto_name[k] = hit[0] if hit else k[1]
        oa_of[k] = hit[1] if hit else None

    used_pointers: set[str] = set()
    out: list[OutMessage] = []
    for k in keys:
        msg = pb[k]
        pkg, _ = k
        name = proto_name[k]
        t = oa_of[k]
        special = SPECIALS.get((pkg, name), "None")
        if (
            special == "None"
            and t is None
            and len(msg.fields) == 1
            and msg.fields[0].rust == "items"
            and msg.fields[0].card == "repeated"
            and msg.fields[0].tag == 1
        ):
            special = "ListWrapper"  # Go type `[]T` that go-to-protobuf wraps in a message
        ptrs = pointers.get((pkg, name), {})
        fields = []
        for f in msg.fields:
            n = norm(f.rust)
            card = f.card
            if (pkg, name, f.rust) in NAME_OVERRIDES:
                js = NAME_OVERRIDES[(pkg, name, f.rust)]
            elif t is not None and n in t.json_by_norm:
                js = t.json_by_norm[n]
            elif t is not None and f.msg is not None and f.card == "single" and inlinable(pb, f.msg, t):
                js = ""  # embedded Go struct (`json:",inline"`): its fields belong to the parent
                card = "inline"
            else:
                known = global_names.get(n, set())
                js = next(iter(known)) if len(known) == 1 else camel(f.rust)
                if special == "None" and (t is not None or len(known) != 1):
                    warnings.append(f"{pkg}.{name}.{f.rust}: no JSON name in k8s-openapi; using {js!r}")
            if f.msg is not None:
                ty = f"M({index[f.msg]})"
                presence = "IfSet"
            else:
                ty = SCALARS[f.scalar]
                if card != "single":
                    presence = "IfSet"
                elif t is not None and js in t.required:
                    presence = "Always"
                elif n in ptrs:
                    presence = "IfSet"
                    used_pointers.add(ptrs[n])
                elif pkg in covered or f.scalar in ("string", "bytes"):
                    presence = "NonZero"
                else:
                    presence = "IfSet"  # not covered by the Go data: keep whatever was sent
            fields.append(OutField(f.tag, js, ty, card, presence))
        required = sorted(t.required_now & {fl.json for fl in fields}) if t is not None else []
        out.append(OutMessage(f"k8s.io.{pkg}.{name}", special, fields, required))

    for (pkg, struct), entries in pointers.items():
        for n, src in entries.items():
            if src not in used_pointers:
                # Either a typo or a pointer to a message/required field (harmless); only flag
                # entries that match no proto field at all.
                key = next((k for k in keys if k[0] == pkg and proto_name[k] == struct), None)
                if key is None or n not in {norm(f.rust) for f in pb[key].fields}:
                    warnings.append(f"{src}: no such proto field (newer than k8s-pb?)")

    # Kinds: from k8s-pb and k8s-openapi `impl Resource` (the latter adds Scale, Eviction, ...).
    kinds: dict[tuple[str, str, str], int] = {}
    for k in keys:
        res = pb[k].resource or (own_oa[k].resource if own_oa[k] else None)
        if res is None:
            continue
        api_version, kind = res
        group, _, version = api_version.rpartition("/")
        kinds[(group, version, kind)] = index[k]
    for (pkg, name), t in oa.items():
        if t.resource is None:
            continue
        k = next((kk for kk in keys if kk[0] == pkg and proto_name[kk] == name), None)
        if k is None:
            continue
        api_version, kind = t.resource
        group, _, version = api_version.rpartition("/")
        kinds.setdefault((group, version, kind), index[k])
    meta = "apimachinery.pkg.apis.meta.v1"
    wildcard = [(kind, index[(meta, kind)]) for kind in WILDCARD_KINDS]
    return out, sorted(kinds.items()), wildcard, warnings


def render(out, kinds, wildcard, sources) -> str:
    lines = [
        "// @generated by gen/gen_schema.py from the sources of "
        + ", ".join(sources)
        + " and gen/go-pointer-fields.txt.",
        "// Do not edit by hand: regenerate with `python3 crates/setpoint-protobuf/gen/gen_schema.py`.",
        "",
        "use crate::table::{f, Card::*, Kind, Message, Presence::*, Special, Ty::*};",
        "",
        "/// Every message of k8s.io/api, apimachinery, apiextensions-apiserver, kube-aggregator and metrics.",
        "pub(crate) static MESSAGES: &[Message] = &[",
    ]
    for i, m in enumerate(out):
        lines.append(f"    // {i}")
        lines.append(f'    Message {{ name: "{m.name}", special: Special::{m.special}, fields: &[')
        for fl in m.fields:
            lines.append(f'        f({fl.tag}, "{fl.json}", {fl.ty}, {fl.card.capitalize()}, {fl.presence}),')
        lines.append("    ] },")
    lines.append("];")
    lines.append("")
    lines.append("/// (group, version, kind) of every top-level kind, sorted for binary search.")
    lines.append("pub(crate) static KINDS: &[Kind] = &[")
    for (g, v, k), i in kinds:
        lines.append(f'    Kind {{ group: "{g}", version: "{v}", kind: "{k}", message: {i} }},')
    lines.append("];")
    lines.append("")
    lines.append("/// meta/v1 kinds that every group version registers.")
    lines.append("pub(crate) static WILDCARD_KINDS: &[(&str, u16)] = &[")
    for k, i in wildcard:
        lines.append(f'    ("{k}", {i}),')
    lines.append("];")
    lines.append("")
    return "\n".join(lines)


def rust_str(text: str) -> str:
    text = "".join(c for c in text if c in "\n\t" or ord(c) >= 0x20)
    return json.dumps(text, ensure_ascii=False)


def render_docs(out, pb_keys, docs, sources) -> str:
    """`src/docs.rs`: descriptions and required properties, parallel to `schema::MESSAGES`."""
    lines = [
        "// @generated by gen/gen_schema.py from the doc comments of " + sources[0] + " and the required",
        "// properties of " + sources[1] + ".",
        "// Do not edit by hand: regenerate with `python3 crates/setpoint-protobuf/gen/gen_schema.py`.",
        "",
        "/// The description of every message, indexed like `schema::MESSAGES`.",
        "pub(crate) static MESSAGE_DOCS: &[&str] = &[",
    ]
    for (pkg, rust_name) in pb_keys:
        lines.append(f"    {rust_str(docs.get((pkg, rust_name, None), ''))},")
    lines.append("];")
    lines.append("")
    lines.append("/// The description of every field, indexed like `schema::MESSAGES` and their `fields`.")
    lines.append("pub(crate) static FIELD_DOCS: &[&[&str]] = &[")
    for i, ((pkg, rust_name), m) in enumerate(zip(pb_keys, out)):
        pb_fields = docs.get(("fields", pkg, rust_name)) or []
        items = ", ".join(rust_str(docs.get((pkg, rust_name, r), "")) for r in pb_fields)
        lines.append(f"    /* {i} */ &[{items}],")
    lines.append("];")
    lines.append("")
    lines.append("/// `+listType` / `+listMapKey` markers: (message index, field position, list type, map keys).")
    lines.append("pub(crate) static LIST_TYPES: &[(u16, u16, &str, &[&str])] = &[")
    for i, (pkg, rust_name) in enumerate(pb_keys):
        for j, r in enumerate(docs.get(("fields", pkg, rust_name)) or []):
            lt = docs.get(("list", pkg, rust_name, r))
            if lt:
                keys = ", ".join(rust_str(k) for k in lt[1])
                lines.append(f"    ({i}, {j}, {rust_str(lt[0])}, &[{keys}]),")
    lines.append("];")
    lines.append("")
    lines.append("/// The required JSON properties of every message, indexed like `schema::MESSAGES`.")
    lines.append("pub(crate) static REQUIRED: &[&[&str]] = &[")
    for m in out:
        lines.append("    &[" + ", ".join(rust_str(r) for r in m.required) + "],")
    lines.append("];")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k8s-pb", type=Path, help="k8s-pb crate directory (default: via cargo metadata)")
    ap.add_argument("--k8s-openapi", type=Path, help="k8s-openapi crate directory (default: via cargo metadata)")
    ap.add_argument("--pointers", type=Path, default=CRATE_DIR / "gen" / "go-pointer-fields.txt")
    ap.add_argument("--out", type=Path, default=CRATE_DIR / "src" / "schema.rs")
    ap.add_argument("--docs-out", type=Path, default=CRATE_DIR / "src" / "docs.rs")
    ap.add_argument("--verbose", action="store_true", help="print every fallback JSON name")
    args = ap.parse_args()
    pb_dir, oa_dir = args.k8s_pb, args.k8s_openapi
    if pb_dir is None or oa_dir is None:
        pb_found, oa_found = locate_crates()
        pb_dir = pb_dir or pb_found
        oa_dir = oa_dir or oa_found
    pb = parse_k8s_pb(pb_dir)
    oa = parse_k8s_openapi(oa_dir)
    covered, pointers = parse_pointer_file(args.pointers)
    out, kinds, wildcard, warnings = build(pb, oa, covered, pointers)
    text = render(out, kinds, wildcard, [pb_dir.name, oa_dir.name])
    args.out.write_text(text)
    docs = parse_k8s_pb_docs(pb_dir)
    pb_keys = sorted(pb.keys())
    for k in pb_keys:
        docs[("fields", *k)] = [f.rust for f in pb[k].fields]
    args.docs_out.write_text(render_docs(out, pb_keys, docs, [pb_dir.name, oa_dir.name]))
    print(f"wrote {args.docs_out}", file=sys.stderr)
    nfields = sum(len(m.fields) for m in out)
    print(f"wrote {args.out}: {len(out)} messages, {nfields} fields, {len(kinds)} kinds", file=sys.stderr)
    if warnings:
        print(f"{len(warnings)} fields without a k8s-openapi JSON name (camelCased fallback)", file=sys.stderr)
        for w in warnings if args.verbose else warnings[:20]:
            print("  " + w, file=sys.stderr)


if __name__ == "__main__":
    main()
