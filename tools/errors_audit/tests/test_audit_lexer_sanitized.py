"""The C lexer under AddressSanitizer and UndefinedBehaviorSanitizer.

``_lexer.c`` reads untrusted source text with pointer arithmetic; a read past
a buffer or a signed overflow would not fail a test, it would corrupt memory
or crash an audit. Here the same source is built with
``-fsanitize=address,undefined`` into a temporary folder and driven, in a
subprocess with ASan's runtime preloaded, over 30,000 random texts (the
characters that steer it: quotes, brackets, backslashes, ``\\r``, tabs, form
feeds, a name outside ASCII), with and without barriers, their tables
through ``replaceable_runs`` with random kept flags, and over every file of
both real trees; any sanitizer report aborts the subprocess. Accepted
random texts must also give CPython's table (this found the ``\\r`` case).
Skipped where there is no gcc or no ASan runtime.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from benchmarks.bench_audit import installed_vllm

LEXER_SOURCE = (
    Path(__file__).resolve().parents[1] / "vllm_omni_errors_audit" / "_lexer.c"
)

_DRIVER = textwrap.dedent(
    """\
    import random
    import sys
    from pathlib import Path

    sys.path.insert(0, sys.argv[1])
    import _lexer  # the sanitized build

    from vllm_omni_errors_audit.skeleton import _tokenized_lines

    rng = random.Random(20261201)
    alphabet = "ab_1 (\\n)[]{}:'\\"\\\\#=.,;\\t\\f\\r@rbfu0xe+-*/<>!$\\u00e9    \\n\\n"
    accepted = mismatched = 0
    for _ in range(30_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        table = _lexer.logical_lines(text)
        _lexer.logical_lines(text, sorted(rng.sample(range(1, 20), 3)))
        _lexer.needle_lines(text, (("ab", "1 ", "\\u00e9"), (";",)))
        _lexer.needle_lines(text.encode("utf-8"), (("\\n(",),))
        if table is not None:
            kept = [rng.random() < 0.3 for _ in table[0]]
            _lexer.replaceable_runs(*table[:4], table[5], kept)
            accepted += 1
            tokenized = _tokenized_lines(text)
            if tokenized is None or list(map(list, table[:6])) != list(
                map(list, tokenized[:6])
            ):
                mismatched += 1
    files = 0
    for root in sys.argv[2:]:
        for path in sorted(Path(root).rglob("*.py")):
            try:
                text = path.read_bytes().decode()
            except UnicodeDecodeError:
                continue
            _lexer.logical_lines(text, [1, 50, 100])
            _lexer.needle_lines(text, (("raise", "import"), ("global",), (";",)))
            files += 1
    print(accepted, mismatched, files)
    """
)


def _asan_runtime() -> str | None:
    if shutil.which("gcc") is None:
        return None
    found = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True
    ).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


def test_the_lexer_is_clean_under_asan_and_ubsan(tmp_path: Path) -> None:
    runtime = _asan_runtime()
    if runtime is None:
        pytest.skip("no gcc with AddressSanitizer's runtime here")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built = tmp_path / f"_lexer{suffix}"
    subprocess.run(
        [
            "gcc",
            "-O1",
            "-g",
            "-shared",
            "-fPIC",
            "-fno-omit-frame-pointer",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=undefined",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{sysconfig.get_paths()['include']}",
            str(LEXER_SOURCE),
            "-o",
            str(built),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    wheel = Path.home() / ".cache" / "vllm-omni" / "bench" / "vllm_omni-0.30.0"
    trees = [str(installed_vllm()), *([str(wheel)] if wheel.is_dir() else [])]
    env = {
        **os.environ,
        "LD_PRELOAD": runtime,
        # Every object from malloc, so ASan's red zones surround each string
        # (pymalloc's arenas would hide a read just past one).
        "PYTHONMALLOC": "malloc",
        # CPython itself allocates without freeing at exit: leaks are not
        # what this looks for.
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }
    done = subprocess.run(
        [sys.executable, str(driver), str(tmp_path), *trees],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ERROR: AddressSanitizer" not in done.stderr
    assert "runtime error" not in done.stderr
    accepted, mismatched, files = map(int, done.stdout.split())
    assert mismatched == 0
    assert accepted > 1000
    assert files > 3000
