#!/usr/bin/env python3
"""Regenerate the shim's forwarding and wrapper sources from the libraries' export lists.

The shim must define every function that libibverbs and librdmacm export, with the exact
prototype the headers declare, and wrap every control-path static inline of verbs.h /
rdma_cma.h / rdma_verbs.h in an exported function. Which functions the libraries export is
read from exports/libibverbs.symbols and exports/librdmacm.symbols, which
`gen_shim.py exports LIBDIR...` writes from `nm -D` of the installed libraries of each
supported rdma-core version, each symbol with its version node and whether the shim forwards
it or leaves it out (and why). The prototypes come from the C compiler itself (`-aux-info`)
run over the installed headers (verbs.h, rdma_cma.h, rdma_verbs.h, rsocket.h) and
include/rdma_mummy_extra.h, which declares the few exports the installed headers do not.
Writing ~200 definitions by hand invites typos, so this script writes:

  src/forward.c                 one forwarding definition per exported function
  src/inline.c                  one exported wrapper per control-path static inline
  include/rdma_mummy_inline.h   the prototypes of those wrappers

The outputs are checked in. After a new rdma-core release: `make exports LIBDIRS="DIR..."`
(every directory holding a supported version's libibverbs.so.1, librdmacm.so.1 and
libmlx5.so.1), then
`make regen`. A new export that no rule below classifies stops both with its name. A forwarded
export that not every listed release has is forwarded when the installed headers declare it
and skipped (with a note) when they do not: headers older than the newest release lack its
new functions, and their prototypes come from the headers, never from guesses here. The Rust
tests (rdma-mummy-sys/tests/coverage.rs, tests/exports.rs) fail when the headers declare, or
the installed libraries export, a function the checked-in shim does not define.

The third library, libmlx5 (mlx5's direct verbs, mlx5dv.h), is a provider's: another
provider's direct-verbs library (libefa's efadv.h, say) is one more LIBRARIES entry, header and
export list here, and one more row of the loader's table.
"""

import os
import re
import subprocess
import sys
import tempfile

HEADERS = ["infiniband/verbs.h", "rdma/rdma_cma.h", "rdma/rdma_verbs.h", "infiniband/mlx5dv.h",
           "rdma/rsocket.h", "rdma_mummy_extra.h"]
# The headers whose static inlines the shim wraps (all of mlx5dv.h's: its wr_* setters
# included, which sideway calls through the shim rather than as Rust inlines).
INLINE_HEADERS = HEADERS[:4]
# Each library, the loader's enum value for it, and its symbol table's name in forward.c.
# libmlx5 is the first provider direct-verbs library: optional at run time (the shim loads
# it on first use of an mlx5dv_* function), and never needed by programs that do not call it.
LIBRARIES = {"libibverbs": "MUMMY_LIB_IBVERBS", "librdmacm": "MUMMY_LIB_RDMACM",
             "libmlx5": "MUMMY_LIB_MLX5"}

# Exports the shim leaves out, each with why; the first pattern that matches a name wins.
# Only names in a private version node (IBVERBS_PRIVATE_*) may match: rdma-core builds its
# providers against these, and the node's version changes whenever their ABI does, so no
# program outside rdma-core can rely on them.
LEFT_OUT = [
    (r"ibv_cmd_\w+", "provider interface: the kernel command helpers of rdma-core's providers"),
    (r"_?_?verbs_\w+|execute_ioctl|__ioctl_final_num_attrs",
     "provider interface: driver registration, context set-up and ioctl marshalling"),
    (r"ibv_read_ibdev_sysfs_file",
     "provider interface: takes libibverbs' internal struct verbs_sysfs_dev"),
]
# Private-node exports the shim forwards all the same, each with why.
PRIVATE_FORWARDED = {
    "ibv_query_gid_type": "rdma-core's own ibv_devinfo calls it; its driver.h declares it",
    "ibv_wr_opcode_str": "the public verbs.h of rdma-core 56 declares it",
}
# An export that exists only under a non-default version (`name@VERSION`, no `@@`): the
# linker refuses to bind new programs to it and dlsym() does not return it.
COMPAT_ONLY = "compatibility symbol only (no default version): no program can link it"

# Exported functions whose failure is reported by returning an errno value (man pages:
# "returns 0 on success, or the value of errno on failure").
RETURNS_ERRNO = {
    "ibv_query_device", "ibv_query_port", "ibv_dealloc_pd", "ibv_dereg_mr",
    "ibv_destroy_comp_channel", "ibv_resize_cq", "ibv_destroy_cq", "ibv_modify_srq",
    "ibv_query_srq", "ibv_destroy_srq", "ibv_modify_qp", "ibv_query_qp", "ibv_destroy_qp",
    "ibv_destroy_ah", "ibv_attach_mcast", "ibv_detach_mcast", "ibv_fork_init", "ibv_set_ece",
    "ibv_query_ece", "ibv_resolve_eth_l2_from_gid", "_ibv_query_gid_ex",
}
# Special failure values, each with the reason it is the documented one.
SPECIAL_FAILURE = {
    # "returns the number of entries ... or negative errno value on error"
    "_ibv_query_gid_table": "-EOPNOTSUPP",
    # IBV_REREG_MR_ERR_INPUT: "Old MR is valid, an input error was detected by libibverbs"
    "ibv_rereg_mr": "IBV_REREG_MR_ERR_INPUT",
    # 0 means "data is not guaranteed to be written in order", the safe answer.
    "ibv_query_qp_data_in_order": "0",
    # The value these conversions return for an input they do not know.
    "mult_to_ibv_rate": "IBV_RATE_MAX",
    "mbps_to_ibv_rate": "IBV_RATE_MAX",
    # No library, so nothing called ibv_fork_init.
    "ibv_is_fork_initialized": "IBV_FORK_DISABLED",
    # A GUID or port of zero is what libibverbs reports when it cannot read one.
    "ibv_get_device_guid": "0",
    "rdma_get_src_port": "0",
    "rdma_get_dst_port": "0",
    # rsocket.h declares it size_t; rsocket returns -1 converted, as write() would.
    "riowrite": "(size_t)-1",
}
# The *_str helpers never fail in libibverbs and callers hand their result straight to
# printf, so NULL would turn a missing library into a crash in the caller.
UNKNOWN_STRING = '"unknown (rdma-core library not loaded)"'

# Static inlines that stay inline: the data path (bound as #[inline] Rust functions calling
# the provider's function pointers) and the headers' internal helpers.
NOT_WRAPPED = {
    "verbs_get_ctx", "rdma_seterrno", "__ibv_reg_mr", "__ibv_reg_mr_iova",
    "__ibv_get_device_list", "ibv_post_send", "ibv_post_recv", "ibv_post_srq_recv",
    "ibv_post_wq_recv", "ibv_poll_cq", "ibv_req_notify_cq", "ibv_start_poll",
    "ibv_next_poll", "ibv_end_poll",
}
DATA_PATH_PREFIXES = ("ibv_wr_", "ibv_wc_read_")
# mlx5dv.h's DEVX_SET/DEVX_GET macro helpers: bit twiddling on caller memory, no library call.
NOT_WRAPPED |= {"_devx_set", "_devx_get", "_devx_set64", "_devx_get64"}

DECL = re.compile(
    r"^/\* (?P<file>\S+):(?P<line>\d+):N[CF] \*/ (?P<storage>extern|static) "
    r"(?P<ret>.*?)(?P<name>\w+) \((?P<params>.*?)\);"
)


def aux_info(cc, cflags):
    """Every prototype the headers declare, as the compiler prints it."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            for h in HEADERS:
                f.write(f"#include <{h}>\n")
        aux = os.path.join(tmp, "aux.txt")
        subprocess.run([cc, *cflags, "-aux-info", aux, "-c", src, "-o",
                        os.path.join(tmp, "probe.o")], check=True)
        with open(aux) as f:
            return f.read().splitlines()


def split_params(params):
    """Split a parameter list at its top-level commas."""
    out, depth, cur = [], 0, ""
    for ch in params:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch in "(["
        depth -= ch in ")]"
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return [] if out == ["void"] else out


def name_param(ctype, name):
    """Give an unnamed parameter type a name: `void (*)(int)` -> `void (*name)(int)`."""
    if "(*)" in ctype:
        return ctype.replace("(*)", f"(*{name})", 1)
    if ctype.endswith("]"):
        i = ctype.index("[")
        return f"{ctype[:i]}{name}{ctype[i:]}"
    return f"{ctype}{'' if ctype.endswith('*') else ' '}{name}"


def failure(name, ret, lib):
    if name in SPECIAL_FAILURE:
        return SPECIAL_FAILURE[name]
    if ret == "void":
        return None
    if ret == "_Bool":
        # mlx5dv_is_supported(): without the library no device is an mlx5 one.
        return "0"
    if lib == "MUMMY_LIB_MLX5" and ret == "int":
        # mlx5dv(7)'s functions returning int report failure with an errno value
        # ("0 on success or the value of errno on failure"), as mlx5dv_query_device does.
        return "EOPNOTSUPP"
    if ret.endswith("*"):
        return UNKNOWN_STRING if ret == "const char *" and name.endswith("_str") else "NULL"
    if name in RETURNS_ERRNO:
        return "EOPNOTSUPP"
    if ret in ("int", "ssize_t", "off_t"):
        return "-1"
    sys.exit(f"gen_shim.py: no documented failure value for {ret} {name}(); add it")


# Variadic exports cannot be forwarded generically: the argument must be read with its type.
# rfcntl() takes fcntl()'s commands; the argument's type follows from the command as in
# fcntl(2): none, an int, or a pointer.
VARIADIC = {
    "rfcntl": """int (rfcntl)(int socket, int cmd, ...)
{
	va_list ap;
	int ret;

	mummy_load(MUMMY_LIB_RDMACM);
	if (!mummy_fn_rfcntl) {
		errno = EOPNOTSUPP;
		return -1;
	}
	va_start(ap, cmd);
	switch (cmd) {
	case F_SETFL:
	case F_SETFD:
	case F_DUPFD:
	case F_DUPFD_CLOEXEC:
	case F_SETOWN:
		ret = mummy_fn_rfcntl(socket, cmd, va_arg(ap, int));
		break;
	case F_GETLK:
	case F_SETLK:
	case F_SETLKW:
		ret = mummy_fn_rfcntl(socket, cmd, va_arg(ap, void *));
		break;
	default:
		ret = mummy_fn_rfcntl(socket, cmd);
		break;
	}
	va_end(ap);
	return ret;
}

""",
}


def exports_path(here, lib):
    return os.path.join(here, "exports", f"{lib}.symbols")


def read_exports(here):
    """[(library, name, version, disposition)] from the checked-in export lists."""
    return [(lib, name, version, disposition)
            for lib, name, version, _newer, disposition in read_exports_full(here)]


def read_exports_full(here):
    """[(library, name, version, newer, disposition)]: `newer` when not every release the
    list covers (its `# releases:` line) exports the name."""
    out = []
    for lib in LIBRARIES:
        releases = set()
        with open(exports_path(here, lib)) as f:
            for line in f:
                if line.startswith("# releases:"):
                    releases = set(line.split(":", 1)[1].strip().split(","))
                if line.startswith("#") or not line.strip():
                    continue
                name, version, present, disposition = line.rstrip("\n").split(" ", 3)
                newer = not releases <= set(present.split(","))
                out.append((lib, name, version, newer, disposition))
    return out


def classify(name, version, default):
    """'forward', or 'left out: <why>', for one export; exits on one no rule covers."""
    if not default:
        return f"left out: {COMPAT_ONLY}"
    if "PRIVATE" not in version:
        return "forward"
    if name in PRIVATE_FORWARDED:
        return f"forward (private: {PRIVATE_FORWARDED[name]})"
    for pattern, why in LEFT_OUT:
        if re.fullmatch(pattern, name):
            return f"left out: {why}"
    sys.exit(f"gen_shim.py: {name}@{version} is a private export no rule covers; add it to "
             "LEFT_OUT or PRIVATE_FORWARDED, with the reason")


def nm_exports(path):
    """{name: (version, default)} of the functions and data a shared library exports."""
    text = subprocess.run(["nm", "-D", "--defined-only", "--with-symbol-versions", path],
                          check=True, capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 3 or fields[1] == "A":
            continue  # version node definitions (type A) are not symbols
        sym = fields[2]
        if "@@" in sym:
            name, version = sym.split("@@")
            out[name] = (version, True)
        elif "@" in sym:
            name, version = sym.split("@")
            out.setdefault(name, (version, False))
    return out


def write_exports(here, libdirs):
    """exports/<lib>.symbols: the union of what each LIBDIR's library exports."""
    for lib in LIBRARIES:
        merged, present, sources, releases = {}, {}, [], []
        for d in libdirs:
            path = os.path.join(d, f"{lib}.so.1")
            real = os.path.basename(os.path.realpath(path))
            # libibverbs.so.1.14.56.1: ABI 1.14 of rdma-core 56.1.
            m = re.fullmatch(rf"{lib}\.so\.1\.\d+\.(\d+\.\d+)", real)
            if not m:
                sys.exit(f"gen_shim.py: cannot tell the rdma-core version of {path} ({real})")
            releases.append(m[1])
            sources.append(f"rdma-core {m[1]} ({real})")
            for name, (version, default) in nm_exports(path).items():
                present.setdefault(name, []).append(m[1])
                old = merged.get(name)
                if old is None or (default and not old[1]):
                    merged[name] = (version, default)
        lines = [f"# {lib}.so.1's exports: `nm -D --defined-only --with-symbol-versions` of\n",
                 f"# {', '.join(sources)}, merged.\n",
                 "# Written by `gen_shim.py exports LIBDIR...` (`make exports`); read by gen_shim.py\n",
                 "# and rdma-mummy-sys/tests/exports.rs. Each line: NAME VERSION-NODE\n",
                 "# RELEASES-THAT-EXPORT-IT DISPOSITION.\n",
                 f"# releases: {','.join(releases)}\n"]
        for name in sorted(merged):
            version, default = merged[name]
            lines.append(f"{name} {version} {','.join(present[name])} "
                         f"{classify(name, version, default)}\n")
        os.makedirs(os.path.dirname(exports_path(here, lib)), exist_ok=True)
        with open(exports_path(here, lib), "w") as f:
            f.write("".join(lines))
        n = sum(1 for line in lines if " forward" in line)
        print(f"gen_shim.py: {lib}: {len(merged)} exports, {n} forwarded")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.argv[1:2] == ["exports"]:
        if len(sys.argv) < 3:
            sys.exit("usage: gen_shim.py exports LIBDIR... (directories holding libibverbs.so.1 "
                     "and librdmacm.so.1)")
        write_exports(here, sys.argv[2:])
        return
    cc = os.environ.get("CC", "cc")
    cflags = os.environ.get("CFLAGS", "").split() + ["-I" + os.path.join(here, "include")]
    declared, inlines = {}, []
    for line in aux_info(cc, cflags):
        m = DECL.match(line)
        if not m:
            continue
        header = next((h for h in HEADERS if m["file"].endswith("/" + h)), None)
        if header is None:
            continue
        ret = m["ret"].strip()
        params = split_params(m["params"])
        if m["storage"] == "extern":
            declared.setdefault(m["name"], (header, ret, params))
        elif header in INLINE_HEADERS and m["name"] not in NOT_WRAPPED \
                and not m["name"].startswith(DATA_PATH_PREFIXES):
            inlines.append((header, ret, m["name"], params))

    exported, listed, undeclared = [], set(), []
    for lib, name, version, newer, disposition in read_exports_full(here):
        listed.add(name)
        if not disposition.startswith("forward"):
            continue
        if name not in declared and newer:
            # Present in the headers => forwarded: an export of a newer release than the
            # installed headers' (rsocket's repoll_* of RDMACM_1.5, say) is forwarded once
            # `make regen` runs over headers that declare it, with their prototype. Until
            # then the shim lacks it, and nothing here can call it: no header declares it.
            undeclared.append(f"{name}@{version}")
            continue
        if name not in declared:
            sys.exit(f"gen_shim.py: {lib} exports {name}@{version}, but no header declares it; "
                     "declare it in include/rdma_mummy_extra.h")
        header, ret, params = declared[name]
        exported.append((LIBRARIES[lib], ret, name, params))
    unlisted = sorted(n for n in declared if n not in listed)
    if unlisted:
        sys.exit(f"gen_shim.py: the headers declare {', '.join(unlisted)}, which the export "
                 "lists lack; `make exports` from the libraries of this rdma-core version")

    banner = ("/* Generated by gen_shim.py from the export lists (exports/) and the rdma-core\n"
              " * headers; do not edit.\n"
              " * Regenerate with `make regen`. */\n")

    fwd = [banner, "#include <fcntl.h>\n#include <stdarg.h>\n\n#include \"mummy.h\"\n\n",
           "/* -aux-info prints array parameters (ibv_resolve_eth_l2_from_gid's eth_mac[6])\n"
           " * decayed to pointers; the types are compatible, so GCC's -Warray-parameter note\n"
           " * about the spelling is noise here. */\n"
           "#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11\n"
           '#pragma GCC diagnostic ignored "-Warray-parameter"\n#endif\n\n'
           "/* Each definition parenthesises its name so that a function-like macro of the same\n"
           " * name (verbs.h has them for ibv_query_port, ibv_reg_mr, ...) does not replace the\n"
           " * real exported symbol. A missing library or symbol fails the way the verb's man\n"
           " * page documents, with errno = EOPNOTSUPP. */\n\n"]
    table = {lib: [] for lib in LIBRARIES.values()}
    for lib, ret, name, params in exported:
        args = [f"a{i}" for i in range(len(params))]
        decl_params = ", ".join(name_param(p, a) for p, a in zip(params, args)) or "void"
        # The name is parenthesised so that a function-like macro of the same name (verbs.h
        # has them for ibv_query_port, ibv_reg_mr, ...) does not hide the real symbol.
        fwd.append(f"static __typeof__({name}) *mummy_fn_{name};\n")
        table[lib].append(name)
        if "..." in params:
            if name not in VARIADIC:
                sys.exit(f"gen_shim.py: {name} is variadic; write its forwarder in VARIADIC")
            fwd.append(VARIADIC[name])
            continue
        fail = failure(name, ret, lib)
        fwd.append(f"{ret}{'' if ret.endswith('*') else ' '}({name})({decl_params})\n{{\n")
        fwd.append(f"\tmummy_load({lib});\n\tif (!mummy_fn_{name}) {{\n")
        fwd.append("\t\terrno = EOPNOTSUPP;\n")
        fwd.append(f"\t\treturn{'' if fail is None else ' ' + fail};\n\t}}\n")
        call = f"mummy_fn_{name}({', '.join(args)})"
        fwd.append(f"\t{call};\n}}\n\n" if ret == "void" else f"\treturn {call};\n}}\n\n")
    for lib, names in table.items():
        var = f"mummy_{lib.removeprefix('MUMMY_LIB_').lower()}_symbols"
        fwd.append(f"const struct mummy_symbol {var}[] = {{\n")
        for name in names:
            fwd.append(f'\t{{ "{name}", (void **)&mummy_fn_{name} }},\n')
        fwd.append("\t{ NULL, NULL },\n};\n\n")

    inc = [banner, "#ifndef RDMA_MUMMY_INLINE_H\n#define RDMA_MUMMY_INLINE_H\n\n",
           "#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n#include <rdma/rdma_verbs.h>\n"
           "#include <infiniband/mlx5dv.h>\n\n",
           "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n"]
    src = [banner, '#include "rdma_mummy.h"\n\n']
    for header, ret, name, params in inlines:
        public = "rdma_mummy_" + name.lstrip("_")
        proto = f"{ret}{'' if ret.endswith('*') else ' '}{public}({', '.join(params) or 'void'})"
        inc.append(f"/* Exported form of the static inline {name}() of <{header}>. */\n{proto};\n\n")
        args = [p.split()[-1].lstrip("*") for p in params]
        call = f"{name}({', '.join(args)})"
        src.append(f"{proto}\n{{\n\t{'' if ret == 'void' else 'return '}{call};\n}}\n\n")
    inc.append("#ifdef __cplusplus\n}\n#endif\n\n#endif\n")

    for path, text in (("src/forward.c", fwd), ("src/inline.c", src),
                       ("include/rdma_mummy_inline.h", inc)):
        with open(os.path.join(here, path), "w") as f:
            f.write("".join(text))
    print(f"gen_shim.py: {len(exported)} forwarded functions, {len(inlines)} wrapped inlines")
    if undeclared:
        print(f"gen_shim.py: not forwarded, as the installed headers do not declare them (exports "
              f"of a newer rdma-core; `make regen` over its headers forwards them): "
              f"{', '.join(undeclared)}")
    left_out = [n for _, n, _, d in read_exports(here) if d.startswith("left out")]
    print(f"gen_shim.py: {len(left_out)} exports left out (see exports/*.symbols)")


if __name__ == "__main__":
    main()
