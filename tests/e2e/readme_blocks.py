#!/usr/bin/env python3
"""readme_blocks.py — README.md's shell blocks, as the tests run them.

Every fenced ```sh block of README.md follows an HTML comment that says how it is run:

    <!-- readme-example: NAME (tests/e2e/SCRIPT.sh runs this block as written, ...) -->
    <!-- readme-example: none (why it cannot run in the test suite, and what checks it) -->

The comment may span lines; only blank lines may stand between it and the fence.

    readme_blocks.py lint README.md TOP
        every ```sh block has such a comment; the names are unique; a named block names a
        test script under TOP that exists and runs it (calls `readme_block NAME`); a block
        marked none gives its reason.  Exit 1 with one line per problem.
    readme_blocks.py block README.md NAME [REGEX ARGS]...
        prints block NAME as written (the fence's indentation removed), with ARGS appended
        to every command that REGEX matches (re.search on the command with its
        backslash-continued lines joined), before the command's trailing comment.  Exit 2
        when there is no such block, or when a REGEX matches no command of the block (so a
        test cannot silently stop scaling a command that the README changed).
"""
import os
import re
import sys

MARK = re.compile(r"<!--\s*readme-example:\s*([A-Za-z0-9_-]+)\s*(.*)$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


def blocks(path):
    """[(line number of the fence, lang, marker name or None, marker text, body lines)]"""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        body = [l[len(indent):] if l.startswith(indent) else l.lstrip() for l in lines[i + 1:j]]
        # the comment ending on the nearest non-blank line above the fence
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        name, text = None, ""
        if k >= 0 and lines[k].rstrip().endswith("-->"):
            c = k
            while c >= 0 and "<!--" not in lines[c]:
                c -= 1
            mm = MARK.search(lines[c]) if c >= 0 else None
            if mm:
                name = mm.group(1)
                text = " ".join(l.strip() for l in lines[c:k + 1])
        out.append((start + 1, lang, name, text, body))
        i = j + 1
    return out


def lint(readme, top):
    problems, seen = [], {}
    for line, lang, name, text, _ in blocks(readme):
        if lang != "sh":
            continue
        where = f"{readme}:{line}"
        if name is None:
            problems.append(f"{where}: a ```sh block without a '<!-- readme-example: NAME "
                            f"(...) -->' comment above it saying how the test suite runs it")
            continue
        if name == "none":
            why = re.sub(r"^.*readme-example:\s*none\s*", "", text).strip(" ()->")
            if len(why.split()) < 4:
                problems.append(f"{where}: 'readme-example: none' needs the reason the block "
                                f"is not run, in parentheses")
            continue
        if name in seen:
            problems.append(f"{where}: block name '{name}' is also used at line {seen[name]}")
        seen[name] = line
        scripts = re.findall(r"tests/[\w/.-]+\.sh", text)
        if not scripts:
            problems.append(f"{where}: block '{name}' names no tests/...sh script that runs it")
            continue
        script = os.path.join(top, scripts[0])
        if not os.path.isfile(script):
            problems.append(f"{where}: block '{name}': {scripts[0]} does not exist")
        elif not re.search(rf"readme_block\s+{re.escape(name)}\b", open(script).read()):
            problems.append(f"{where}: block '{name}': {scripts[0]} does not run it "
                            f"(no 'readme_block {name}')")
    for p in problems:
        print(p)
    return 1 if problems else 0


def split_comment(cmd):
    """(command, ' # comment' or '') at the first '#' outside quotes after a blank"""
    quote = None
    for i, ch in enumerate(cmd):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i > 0 and cmd[i - 1] in " \t":
            return cmd[:i].rstrip(), "   " + cmd[i:]
    return cmd.rstrip(), ""


def block(readme, name, rules):
    found = [b for b in blocks(readme) if b[2] == name]
    if not found:
        print(f"readme_blocks.py: no block '{name}' in {readme}", file=sys.stderr)
        return 2
    body, cmds, cur = found[0][4], [], ""
    for l in body:  # backslash-continued lines joined
        if l.rstrip().endswith("\\"):
            cur += l.rstrip()[:-1].rstrip() + " "
        else:
            cmds.append(cur + l.strip() if cur else l)
            cur = ""
    if cur:
        cmds.append(cur)
    used = [0] * len(rules)
    for n, c in enumerate(cmds):
        cmd, comment = split_comment(c)
        for r, (rx, args) in enumerate(rules):
            if re.search(rx, cmd):
                cmd += " " + args
                used[r] += 1
        cmds[n] = cmd + comment if cmd.strip() else c
    for r, (rx, args) in enumerate(rules):
        if not used[r]:
            print(f"readme_blocks.py: block '{name}': no command matches {rx!r} "
                  f"(to append {args!r})", file=sys.stderr)
            return 2
    print("\n".join(cmds))
    return 0


def main(argv):
    if len(argv) >= 4 and argv[1] == "lint":
        return lint(argv[2], argv[3])
    if len(argv) >= 4 and argv[1] == "block" and len(argv) % 2 == 0:
        rules = list(zip(argv[4::2], argv[5::2]))
        return block(argv[2], argv[3], rules)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
