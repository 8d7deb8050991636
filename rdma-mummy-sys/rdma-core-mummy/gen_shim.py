#!/usr/bin/env python3
"""Regenerate the shim's forwarding and wrapper sources from the system headers.

The shim must define every function that libibverbs and librdmacm export, with the exact
prototype the headers declare, and wrap every control-path static inline of verbs.h /
rdma_cma.h / rdma_verbs.h in an exported function. Writing ~150 definitions by hand invites
typos, so this script asks the C compiler itself (`-aux-info`) for every prototype the headers
declare and writes:

  src/forward.c                 one forwarding definition per exported function
  src/inline.c                  one exported wrapper per control-path static inline
  include/rdma_mummy_inline.h   the prototypes of those wrappers

The outputs are checked in; run `make regen` after moving to newer rdma-core headers. The
Rust coverage test (rdma-mummy-sys/tests/coverage.rs) fails when the headers declare a
function the checked-in shim does not define, which is the signal to regenerate.
"""

import os
import re
import subprocess
import sys
import tempfile

HEADERS = ["infiniband/verbs.h", "rdma/rdma_cma.h", "rdma/rdma_verbs.h"]

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


def failure(name, ret):
    if name in SPECIAL_FAILURE:
        return SPECIAL_FAILURE[name]
    if ret == "void":
        return None
    if ret.endswith("*"):
        return UNKNOWN_STRING if ret == "const char *" and name.endswith("_str") else "NULL"
    if name in RETURNS_ERRNO:
        return "EOPNOTSUPP"
    if ret in ("int", "ssize_t"):
        return "-1"
    sys.exit(f"gen_shim.py: no documented failure value for {ret} {name}(); add it")


def library(header):
    return "MUMMY_LIB_IBVERBS" if header.startswith("infiniband/") else "MUMMY_LIB_RDMACM"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    cc = os.environ.get("CC", "cc")
    cflags = os.environ.get("CFLAGS", "").split()
    exported, inlines = [], []
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
            exported.append((header, ret, m["name"], params))
        elif m["name"] not in NOT_WRAPPED and not m["name"].startswith(DATA_PATH_PREFIXES):
            inlines.append((header, ret, m["name"], params))

    banner = ("/* Generated by gen_shim.py from the rdma-core headers; do not edit.\n"
              " * Regenerate with `make regen`. */\n")

    fwd = [banner, '#include "mummy.h"\n\n',
           "/* -aux-info prints array parameters (ibv_resolve_eth_l2_from_gid's eth_mac[6])\n"
           " * decayed to pointers; the types are compatible, so GCC's -Warray-parameter note\n"
           " * about the spelling is noise here. */\n"
           "#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11\n"
           '#pragma GCC diagnostic ignored "-Warray-parameter"\n#endif\n\n'
           "/* Each definition parenthesises its name so that a function-like macro of the same\n"
           " * name (verbs.h has them for ibv_query_port, ibv_reg_mr, ...) does not replace the\n"
           " * real exported symbol. A missing library or symbol fails the way the verb's man\n"
           " * page documents, with errno = EOPNOTSUPP. */\n\n"]
    table = {"MUMMY_LIB_IBVERBS": [], "MUMMY_LIB_RDMACM": []}
    for header, ret, name, params in exported:
        args = [f"a{i}" for i in range(len(params))]
        decl_params = ", ".join(name_param(p, a) for p, a in zip(params, args)) or "void"
        lib = library(header)
        fail = failure(name, ret)
        # The name is parenthesised so that a function-like macro of the same name (verbs.h
        # has them for ibv_query_port, ibv_reg_mr, ...) does not hide the real symbol.
        fwd.append(f"static __typeof__({name}) *mummy_fn_{name};\n")
        fwd.append(f"{ret}{'' if ret.endswith('*') else ' '}({name})({decl_params})\n{{\n")
        fwd.append(f"\tmummy_load({lib});\n\tif (!mummy_fn_{name}) {{\n")
        fwd.append("\t\terrno = EOPNOTSUPP;\n")
        fwd.append(f"\t\treturn{'' if fail is None else ' ' + fail};\n\t}}\n")
        call = f"mummy_fn_{name}({', '.join(args)})"
        fwd.append(f"\t{call};\n}}\n\n" if ret == "void" else f"\treturn {call};\n}}\n\n")
        table[lib].append(name)
    for lib, names in table.items():
        var = "mummy_ibverbs_symbols" if lib == "MUMMY_LIB_IBVERBS" else "mummy_rdmacm_symbols"
        fwd.append(f"const struct mummy_symbol {var}[] = {{\n")
        for name in names:
            fwd.append(f'\t{{ "{name}", (void **)&mummy_fn_{name} }},\n')
        fwd.append("\t{ NULL, NULL },\n};\n\n")

    inc = [banner, "#ifndef RDMA_MUMMY_INLINE_H\n#define RDMA_MUMMY_INLINE_H\n\n",
           "#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n#include <rdma/rdma_verbs.h>\n\n",
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


if __name__ == "__main__":
    main()
