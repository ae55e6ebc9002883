"""The harness's Python copies held against their Rust and Lua sources: the key
schema (shared/src/keys.rs) and the Lua scripts' KEYS/ARGV (shared/src/lua).
No stack: these read source files only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from harness import REPO_ROOT, keys, lua
from harness.keys import Field, Keys
from harness.procs import HarnessError

SHARED_SRC = REPO_ROOT / "shared" / "src"


def rust_source_with(marker: str) -> str:
    """The shared crate's source file that contains `marker` (keys.rs today;
    found by content so that moving a type to another module keeps the check)."""
    found = [p for p in sorted(SHARED_SRC.rglob("*.rs")) if marker in p.read_text()]
    assert found, f"no file under {SHARED_SRC} contains {marker!r}: has the key schema's shape changed?"
    return "\n".join(p.read_text() for p in found)


def rust_key_templates(source: str) -> dict[str, tuple[list[str], str]]:
    """`Keys`' String-returning methods: name -> (parameters, a template with
    `{prefix}` and `{<parameter>}`). `format!("{}:...", self.prefix)` and
    `format!("{}:...", self.<method>())` are the two shapes keys.rs uses."""
    impl = source[source.index("impl Keys {") :]
    methods = re.findall(
        r"pub fn (\w+)\(&self((?:, \w+: [^,)]+)*)\) -> String \{\s*format!\(\"([^\"]*)\", self\.(\w+)(\(\))?\)",
        impl,
    )
    out: dict[str, tuple[list[str], str]] = {}
    for name, params, fmt, first, call in methods:
        out[name] = ([p.split(":")[0].strip() for p in params.split(",") if p.strip()], fmt)
        out[name] = (out[name][0], fmt.replace("{}", "{prefix}" if not call else "{@" + first + "}", 1))
    for name, (params, template) in out.items():  # inline a call of another method
        while m := re.search(r"\{@(\w+)\}", template):
            template = template.replace(m.group(0), out[m.group(1)][1])
        out[name] = (params, template)
    return out


def test_every_key_name_is_the_rust_one() -> None:
    rust = rust_key_templates(rust_source_with("impl Keys {"))
    assert len(rust) >= 10, f"found only {sorted(rust)} in `impl Keys`: has its shape changed?"
    python = {n for n in vars(Keys) if not n.startswith("_")}
    assert python == set(rust), f"only in Python {sorted(python - set(rust))}, only in Rust {sorted(set(rust) - python)}"
    for name, (params, template) in rust.items():
        values = {p: f"<{p}>" for p in params}
        want = template.format(prefix="P", **values)
        got = getattr(Keys("P"), name)(*values.values())
        assert got == want, f"Keys.{name}: Python makes {got!r}, keys.rs {want!r}"


def test_every_record_field_is_the_rust_one() -> None:
    # `Field`'s stored names are derived by strum from its variants, in snake case:
    # read the variants and the rule, and apply the rule here.
    source = rust_source_with("enum Field")
    head, _, body = source.partition("pub enum Field {")
    assert body, "no `pub enum Field {` in shared/src: has it moved?"
    assert 'serialize_all = "snake_case"' in head[-600:], "Field's stored names are no longer snake case"
    body = body[: body.index("\n}")]
    variants = re.findall(r"^\s*([A-Z]\w*),\s*$", re.sub(r"//.*", "", body), flags=re.M)
    assert len(variants) >= 20, f"found only {variants} in `enum Field`: has its shape changed?"
    rust = {re.sub(r"(?<!^)(?=[A-Z])", "_", v).upper(): re.sub(r"(?<!^)(?=[A-Z])", "_", v).lower() for v in variants}
    assert {f.name: f.value for f in Field} == rust


def test_every_constant_is_the_rust_one() -> None:
    source = rust_source_with("pub const WORKER_GROUP")
    rust = dict(re.findall(r"pub const (\w+): &(?:'static )?str = \"([^\"]*)\";", source))
    rust |= {n: int(v) for n, v in re.findall(r"pub const (\w+): u64 = ([\d_]+);", source)}
    python = {n: v for n, v in vars(keys).items() if n.isupper() and isinstance(v, str | int) and n != "FINAL_STATES"}
    assert python == rust


def test_every_script_has_a_python_signature_that_matches_its_header() -> None:
    assert lua.script_names() == sorted(lua.SIGNATURES), "a script without a signature, or one without a script"
    for name in lua.SIGNATURES:
        lua.check_signature(name)


def test_a_moved_slot_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: claim.lua with its two arguments swapped."""
    source = (lua.LUA_DIR / "claim.lua").read_text()
    swapped = source.replace("ARGV[1] worker name", "ARGV[1] the stream entry id it read", 1).replace(
        "ARGV[2] the stream entry id it read", "ARGV[2] worker name", 1
    )
    assert swapped != source
    (tmp_path / "claim.lua").write_text(swapped)
    monkeypatch.setattr(lua, "LUA_DIR", tmp_path)
    with pytest.raises(HarnessError, match="claim"):
        lua.check_signature("claim")


def test_a_call_names_every_key_and_argument() -> None:
    keys_, argv = lua.positional(
        "submit",
        {"task": "t", "zip": "z", "stdin": "i", "stats": "s", "jobs": "j", "index": "x", "owner_active": "a",
         "owner_cpu": "c", "owner_index": "o", "workspace": "w", "owner_workspace_index": "ow", "every_workspace": "ew"},
        {"task_id": "1", "zip": "", "stdin": "", "horizon_ms": 9, "max_queued": 5, "owner": "", "owner_max_queued": "",
         "owner_max_running": "", "owner_cpu_ms": "", "workspace_use": "", "workspace_id": "", "workspace_version": "",
         "must_be_head": "", "save_grace_ms": "", "field_pairs": {"state": "queued"}},
    )  # fmt: skip
    assert keys_ == ["t", "z", "i", "s", "j", "x", "a", "c", "o", "w", "ow", "ew"]
    assert argv == ["1", "", "", 9, 5, "", "", "", "", "", "", "", "", "", "state", "queued"]
    with pytest.raises(HarnessError, match="missing"):
        lua.positional("claim", {"task": "t"}, {"worker": "w"})
