#!/usr/bin/env python3
"""Lists the C++ functions in src/ longer than a limit (the developers' guide keeps them under ~80 lines).

    tools/func-lengths.py                    # every function over 80 lines in src/, longest first
    tools/func-lengths.py --limit 60 src/sim # another limit, another tree
    tools/func-lengths.py --check            # exit 1 when a function not allowed is over the limit (the ctest,
                                             # lint.function_lengths, with --self-test)

A function's length runs from the line of its name to the line of its closing brace, both counted. The scan
blanks comments, string and character literals (raw strings too) and preprocessor lines, then matches braces:
a brace block at namespace or class scope whose header has a parameter list is a function (TEST(...) bodies and
lambdas assigned at namespace scope included); class, struct and namespace bodies are entered, enum bodies and
brace initialisers (tables) are not functions. Lambdas and local classes count towards their enclosing function.
It is a lexical scan, not a parser: macros that open braces, or headers it cannot read, may be misjudged, which is
why `--list-all` prints every function it found for a spot check.
"""
import argparse
import re
import sys
from pathlib import Path

# Functions allowed over the limit, each with the reason ("file:name" as this script prints them). A table (one
# entry per line) may stay one table; nothing else belongs here.
ALLOWED = {
    "src/sim/settings.cpp:entries": "the settings table: one entry (key, flag, type, help, apply, show) a setting",
}

# Over the limit today and owned by another engineer's open work: each is to be split and its line removed; the
# check prints them so they are not forgotten. Empty since issue 38 part 1's splits landed; keep it empty.
PENDING = {}

_TEST_MACROS = ("TEST", "TEST_F", "TEST_P", "TYPED_TEST", "RC_GTEST_PROP", "RC_GTEST_FIXTURE_PROP")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_SCOPE_HEAD = re.compile(r"^(?:inline\s+)?(namespace|class|struct|union|enum)\b")


def _quoted_end(text, i):
    """The index just past the literal that opens with the quote at ``text[i]`` (escapes skipped;
    an unterminated one ends the text)."""
    j, n = i + 1, len(text)
    while j < n and text[j] != text[i]:
        j += 2 if text[j] == "\\" else 1
    return j + 1


def blank_code(text):
    """The text with comments, literals and preprocessor lines replaced by spaces (newlines kept)."""
    out = list(text)
    i, n = 0, len(text)
    at_line_start = True

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            at_line_start = True
            i += 1
            continue
        if at_line_start and c == "#":
            j = i
            while j < n and text[j] != "\n":  # a directive runs on over backslash-newlines
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                if text.startswith("/*", j):  # a block comment inside a directive may span lines
                    end = text.find("*/", j + 2)
                    j = n if end < 0 else end + 2
                    continue
                j += 1
            blank(i, j)
            i = j
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == '"':
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i - 1:i + 20]) if i > 0 and text[i - 1] == "R" else None
            if m:  # raw string R"delim( ... )delim"
                end = text.find(")" + m.group(1) + '"', i)
                j = n if end < 0 else end + len(m.group(1)) + 2
            else:
                j = _quoted_end(text, i)
            blank(i, j)
            i = j
        elif c == "'":
            # A digit separator (1'000'000) follows a number's character; a literal does not.
            k = i - 1
            while k >= 0 and (text[k].isalnum() or text[k] in "_."):
                k -= 1
            token = text[k + 1:i]
            if token and token[0].isdigit():
                i += 1
                continue
            j = _quoted_end(text, i)
            blank(i, j)
            i = j
        else:
            i += 1
    return "".join(out)


def match_brace(code, i):
    """The index of the brace closing the one at i."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def strip_template(header):
    """The header without leading `template <...>` clauses and [[attributes]]."""
    h = header.strip()
    while True:
        if h.startswith("[["):
            end = h.find("]]")
            h = h[end + 2:].lstrip() if end >= 0 else h
            continue
        if re.match(r"template\s*<", h):
            depth, k = 0, h.index("<")
            while k < len(h):
                depth += {"<": 1, ">": -1}.get(h[k], 0)
                if depth == 0:
                    break
                k += 1
            h = h[k + 1:].lstrip()
            continue
        return h


def top_level_equals(header):
    """Whether the header assigns (a variable's initialiser), outside parentheses and not `operator=`."""
    depth = 0
    for k, c in enumerate(header):
        if c in "(<[":
            depth += 1
        elif c in ")>]":
            depth = max(0, depth - 1)
        elif c == "=" and depth == 0:
            before = header[:k].rstrip()
            after = header[k + 1:k + 2]
            if before.endswith("operator") or after == "=" or before[-1:] in "=!<>+-*/%&|^":
                continue
            return True
    return False


def function_name(header):
    """The name before the header's parameter list (the last top-level parenthesised group that follows a name)."""
    h = header
    lam = re.search(r"([A-Za-z_][A-Za-z_0-9]*)\s*=\s*\[", h)
    if lam and top_level_equals(h):
        return lam.group(1) + " (lambda)"
    # Cut a constructor's initialiser list and a trailing return type, then take the name before the first '('
    # whose parentheses close at top level.
    m = re.search(r"((?:[A-Za-z_][A-Za-z_0-9]*\s*::\s*)*~?[A-Za-z_][A-Za-z_0-9]*|operator\s*[^\s(]+)\s*\(", h)
    if not m:
        return h.strip().split()[-1] if h.strip() else "?"
    name = re.sub(r"\s+", "", m.group(1))
    if name in _TEST_MACROS:  # the suite and case name (RapidCheck's: and the property's parameters)
        depth, close = 1, m.end()
        while close < len(h) and depth:
            depth += {"(": 1, ")": -1}.get(h[close], 0)
            close += 1
        return name + "(" + re.sub(r"\s+", " ", h[m.end():close - 1]).strip() + ")"
    return name


def scan(code, start, end, found, line_of):
    """Finds the functions in code[start:end], a namespace or class body."""
    header_start = start
    i = start
    init_list = False
    while i < end:
        c = code[i]
        if c in ";}":
            header_start = i + 1
            init_list = False
        elif c == ":" and code[i - 1:i + 1] != "::" and code[i:i + 2] != "::" and code[header_start:i].rstrip().endswith(")"):
            init_list = True  # a constructor's member initialisers follow; their braces are not the body
        elif c == "{":
            header = code[header_start:i]
            h = strip_template(header)
            close = match_brace(code, i)
            scope = _SCOPE_HEAD.match(h)
            ends_with_name = re.search(r"[A-Za-z_0-9>]\s*$", h) and not re.search(
                r"\b(const|noexcept|override|final|mutable)\s*$|->", h)
            if init_list and ends_with_name:
                i = close + 1  # member{value} in an initialiser list
                continue
            if scope or re.match(r'extern\s*"?\s*"?\s*$', h.strip()) or re.match(r"extern\s+\"", h.strip()):
                if scope and scope.group(1) == "enum":
                    pass
                elif "(" not in h or (scope and scope.group(1) in ("namespace", "class", "struct", "union")):
                    scan(code, i + 1, close, found, line_of)
                header_start = close + 1
                i = close + 1
                continue
            is_lambda = top_level_equals(h) and re.search(r"\]\s*(\([^)]*\))?[^=]*$", h)
            if "(" in h and (not top_level_equals(h) or is_lambda):
                name = function_name(h)
                first = header_start + (len(header) - len(header.lstrip()))
                m = re.search(re.escape(name.split("(")[0].split("::")[-1].replace(" (lambda)", "")), code[first:i])
                name_pos = first + m.start() if m else first
                found.append((name, line_of(name_pos), line_of(close)))
            header_start = close + 1
            init_list = False
            i = close + 1
            continue
        i += 1


def functions(path):
    """(name, first line, last line) for every function in the file."""
    code = blank_code(path.read_text(encoding="utf-8", errors="replace"))
    starts = [0]
    for k, c in enumerate(code):
        if c == "\n":
            starts.append(k + 1)
    import bisect

    def line_of(pos):
        return bisect.bisect_right(starts, pos)

    found = []
    scan(code, 0, len(code), found, line_of)
    return found


# The scanner's own check (--self-test, run by the ctest before --check): braces in literals and comments,
# initialiser lists, lambdas, tables, classes and macros, with the lengths a reader counts.
_SELF_TEST = r"""
#define BODY(x) { return x; }
namespace a { namespace {
const char* kText = "}{ not a brace";   // } neither is this
constexpr int kTable[] = {1, 2,
                          3};
enum class E { kA, kB };
struct S {
  S(int v) : v_{v}, w_(v) {}
  int get() const noexcept { return v_; }
  int v_, w_;
};
}  // namespace
int f(int x) {
  auto g = [](int y) { return y + '}'; };
  const char* r = R"x( } )x";
  /* { */
  return g(x) + 1'000;
}
auto h = [](int z) {
  return z;
};
TEST(Suite, Case) {
  EXPECT_EQ(f(1), 1002);
}
template <class T>
T twice(T t) { return 2 * t; }
}  // namespace a
"""
_SELF_TEST_WANT = [("S", 1), ("get", 1), ("f", 6), ("h (lambda)", 3), ("TEST(Suite, Case)", 3), ("twice", 1)]


def self_test():
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as f:
        f.write(_SELF_TEST)
    got = [(name, b - a + 1) for name, a, b in functions(Path(f.name))]
    Path(f.name).unlink()
    if got != _SELF_TEST_WANT:
        print(f"func-lengths: self-test: found {got}, expected {_SELF_TEST_WANT}", file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="*", help="files or folders (default: src/ of this repository)")
    ap.add_argument("--limit", type=int, default=80, help="longest allowed function in lines (default 80)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a function not allowed is over the limit")
    ap.add_argument("--list-all", action="store_true", help="print every function found, with its length")
    ap.add_argument("--self-test", action="store_true", help="check the scanner on a snippet first")
    args = ap.parse_args()
    if args.self_test and self_test() != 0:
        return 1
    repo = Path(__file__).resolve().parent.parent
    roots = [Path(r) for r in args.roots] or [repo / "src"]
    files = []
    for r in roots:
        if r.is_dir():
            files += sorted(p for p in r.rglob("*") if p.suffix in (".cpp", ".hpp", ".h", ".cc", ".inc"))
        elif r.is_file():
            files.append(r)
        else:
            print(f"func-lengths: {r}: no such file or folder", file=sys.stderr)
            return 2
    rows = []
    for f in files:
        try:
            rel = f.resolve().relative_to(repo).as_posix()
        except ValueError:
            rel = f.as_posix()
        for name, a, b in functions(f):
            rows.append((b - a + 1, name, rel, a))
    rows.sort(key=lambda r: (-r[0], r[2], r[3]))
    over = [r for r in rows if r[0] > args.limit]
    shown = rows if args.list_all else over
    bad = pending = 0
    for length, name, rel, line in shown:
        key = f"{rel}:{name}"
        note = ""
        if length > args.limit and key in ALLOWED:
            note = f"  (allowed: {ALLOWED[key]})"
        elif length > args.limit and key in PENDING:
            note = f"  (pending: {PENDING[key]})"
            pending += 1
        elif length > args.limit:
            bad += 1
        print(f"{length:5d}  {name}  {rel}:{line}{note}")
    print(f"func-lengths: {len(rows)} functions in {len(files)} files; {len(over)} over {args.limit} lines"
          f" ({len(over) - bad - pending} allowed, {pending} pending, {bad} to split)", file=sys.stderr)
    return 1 if args.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
