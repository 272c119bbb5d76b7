#!/usr/bin/env python3
"""Files over 500 lines and functions over 60 lines in the C++ of src/ and apps/ (issue 47's limits).

Usage: scripts/long-code.py [--file-lines N] [--function-lines N] [DIR...]   (exit 1 if any)

A function is a brace block whose enclosing blocks are all namespaces, classes, structs, unions or
enums and whose header has a parameter list; its length runs from the header's first line to the
closing brace. Comments and string literals are blanked first, so their braces do not count.
"""
import argparse
import pathlib
import re
import sys

SUFFIXES = {'.cpp', '.hpp', '.h', '.cc'}


def blank(text):
    """The text with comments and string/char literals replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    spaces = lambda s: re.sub(r'[^\n]', ' ', s)
    while i < n:
        if text.startswith('//', i):
            j = text.find('\n', i)
            i = n if j < 0 else j
            continue
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(spaces(text[i:j]))
            i = j
            continue
        raw = re.match(r'R"([^(\s]*)\(', text[i:i + 20]) if not (i and (text[i - 1].isalnum() or text[i - 1] == '_')) else None
        if raw:
            end = ')' + raw.group(1) + '"'
            j = text.find(end, i)
            j = n if j < 0 else j + len(end)
            out.append(spaces(text[i:j]))
            i = j
            continue
        c = text[i]
        if c == "'" and i and text[i - 1].isalnum():  # a digit separator: 1'000
            out.append(' ')
            i += 1
            continue
        if c in '"\'':
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            out.append(spaces(text[i:j + 1]))
            i = j + 1
            continue
        out.append(c)
        i += 1
    return ''.join(out)


def functions(text):
    """(first line, last line, header) of each function body in the text."""
    text = blank(text)
    stack = []  # (is_container, first line, header)
    line, header_start = 1, 0
    for i, c in enumerate(text):
        if c == '\n':
            line += 1
        if c not in ';{}':
            continue
        if c == '{':
            header = text[header_start:i]
            container = bool(re.search(r'\b(namespace|class|struct|enum|union)\b[^()]*$', header)
                             or header.strip().startswith('extern'))
            lead = len(header) - len(header.lstrip())
            first = line - text[header_start + lead:i].count('\n')
            stack.append((container, first, ' '.join(header.split())))
        elif c == '}' and stack:
            container, first, header = stack.pop()
            if not container and '(' in header and all(k for k, _, _ in stack):
                yield first, line, header
        header_start = i + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--file-lines', type=int, default=500)
    ap.add_argument('--function-lines', type=int, default=60)
    ap.add_argument('dirs', nargs='*', default=['src', 'apps'])
    a = ap.parse_args()
    found = 0
    for d in a.dirs:
        for p in sorted(pathlib.Path(d).rglob('*')):
            if p.suffix not in SUFFIXES:
                continue
            text = p.read_text()
            if text.count('\n') > a.file_lines:
                print(f'{p}: {text.count(chr(10))} lines (file)')
                found += 1
            for first, last, header in functions(text):
                if last - first + 1 > a.function_lines:
                    print(f'{p}:{first}: {last - first + 1} lines: {header[-100:]}')
                    found += 1
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main())
