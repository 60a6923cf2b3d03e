#!/usr/bin/env bash
# Counts the files and functions of src/controller/ (tests left out) that one Execution's happy
# path runs through: source-based coverage of the fast-tier scenario in which an Execution with
# its code at hand is sent once and concluded, from the watch hearing it to its result (built with
# `--cfg execution_path`, the scenario drops what its set-up counted: `world::path_begins`).
# Closures and async bodies count as their function.
# Needs the llvm-tools rustup component and rustfilt (`cargo install rustfilt`).
#   bash dev/execution-path.sh            the counts, file by file
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=controller::scenarios::execution_run::an_execution_with_its_code_at_hand_sends_it_once_and_writes_only_its_result
tools="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin"
command -v rustfilt >/dev/null || { echo "rustfilt is missing: cargo install rustfilt" >&2; exit 2; }
[ -x "$tools/llvm-cov" ] || { echo "llvm-cov is missing: rustup component add llvm-tools" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
binary=$(cargo rustc --quiet --lib --profile test --message-format=json -- -C instrument-coverage --cfg execution_path \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])')
LLVM_PROFILE_FILE="$out/run.profraw" "$binary" "$scenario" --exact --test-threads=1 -q >/dev/null
"$tools/llvm-profdata" merge -sparse "$out/run.profraw" -o "$out/run.profdata"
"$tools/llvm-cov" export --format=text --skip-expansions --instr-profile="$out/run.profdata" "$binary" \
  > "$out/coverage.json"
python3 - "$out/coverage.json" <<'PY'
import json, re, subprocess, sys

ran = []
for function in json.load(open(sys.argv[1]))["data"][0]["functions"]:
    files = [f for f in function["filenames"] if "src/controller/" in f]
    if function["count"] == 0 or not files:
        continue
    file = re.sub(r".*?(src/controller/)", r"\1", files[0])
    if "/scenarios/" in file or file.endswith("tests.rs") or "fixtures" in file or "/tests/" in file:
        continue
    ran.append((file, function["name"]))
names = subprocess.run(["rustfilt"], input="\n".join(n for _, n in ran), capture_output=True,
                       text=True, check=True).stdout.split("\n")


def function_of(name):
    previous = None
    while previous != name:
        previous, name = name, re.sub(r"<[^<>]*>", "", name)
    name = re.sub(r"::\{(closure|async_fn|async_block|async_fn_env|closure_env)#\d+\}", "", name)
    return re.sub(r"::h[0-9a-f]{16}$", "", name)


by_file = {}
for (file, _), name in zip(ran, names):
    by_file.setdefault(file, set()).add(function_of(name))
print(f"files {len(by_file)} functions {sum(len(f) for f in by_file.values())}")
for file in sorted(by_file):
    print(f"  {file} {len(by_file[file])}")
PY
