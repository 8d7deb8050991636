//! `stride-compare RAW_TSV OUT_MD OUT_SVG`: the table of `scripts/compare-perftest` from its
//! raw numbers (see [`stride::compare`]): per row the ratio stride / perftest with a 95 %
//! bootstrap interval and a verdict, and the same for CPU time per message.

use std::process::ExitCode;

use stride::compare::{analyse, markdown_table, parse_raw, svg_chart, RESAMPLES};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [raw_path, md_path, svg_path] = args.as_slice() else {
        eprintln!("usage: stride-compare RAW_TSV OUT_MD OUT_SVG");
        return ExitCode::from(2);
    };
    match run(raw_path, md_path, svg_path) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stride-compare: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(raw_path: &str, md_path: &str, svg_path: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(raw_path).map_err(|e| format!("reading {raw_path}: {e}"))?;
    let raw = parse_raw(&text).map_err(|e| format!("{raw_path}: {e}"))?;
    let rows = analyse(&raw, RESAMPLES);
    let method: Vec<&str> = raw
        .notes
        .iter()
        .filter_map(|n| n.strip_prefix("method: "))
        .collect();
    let env: Vec<&str> = raw
        .notes
        .iter()
        .filter(|n| !n.starts_with("method: "))
        .map(String::as_str)
        .collect();
    let svg_name = std::path::Path::new(svg_path)
        .file_name()
        .map_or_else(|| svg_path.to_owned(), |n| n.to_string_lossy().into_owned());
    let mut md = String::from("# stride-perf side by side with perftest\n\n");
    md.push_str(&method.join(" "));
    md.push_str(
        "\n\nEach program's cell is its median over the rounds: average bandwidth in MiB/s for \
         bw rows, typical (median) latency in usec for lat rows. Ratio = stride / perftest of \
         those medians: above 1 is better for bandwidth, below 1 for latency. The 95% interval \
         is a paired bootstrap over the rounds (4000 resamples of whole rounds, each round one \
         run of each program, alternating); the verdict names a program only when the whole \
         interval is on its side of 1, and says \"indistinguishable at N rounds\" otherwise \
         (N: the rounds in which both programs gave a result). CPU/msg is the user + system \
         CPU time of both processes of a run (server and client, whole process lifetime, \
         setup included, from the shell's `time`), divided by the messages of the run, in \
         usec; its ratio and verdict read the same way, lower being better. With few rounds \
         (five) a percentile bootstrap of medians is optimistic, its intervals narrower than a \
         true 95% would be: a lone verdict at five rounds is a reason to run that row again \
         with more rounds, not a finding. CPU per message includes each process's setup \
         (device open, registration, connection), which dominates rows of few messages \
         (256 for 64 KiB bandwidth, 200 for write and send latency).\n\n",
    );
    md.push_str(&format!("Environment: {}.\n\n", env.join("; ")));
    md.push_str(&markdown_table(&rows));
    let failures: Vec<String> = rows
        .iter()
        .filter(|r| r.failed != (0, 0))
        .map(|r| {
            format!(
                "- {}: perftest {}, stride {}",
                r.key.label(),
                r.failed.0,
                r.failed.1
            )
        })
        .collect();
    if !failures.is_empty() {
        md.push_str("\nRuns that printed no usable result (none, or inf):\n\n");
        md.push_str(&failures.join("\n"));
        md.push('\n');
    }
    md.push_str(&format!(
        "\n![ratios with their intervals]({svg_name})\n\nWhat the differences come from, and \
         how the table was made: [compare-perftest-notes.md](compare-perftest-notes.md).\n"
    ));
    std::fs::write(md_path, md).map_err(|e| format!("writing {md_path}: {e}"))?;
    std::fs::write(svg_path, svg_chart(&rows)).map_err(|e| format!("writing {svg_path}: {e}"))?;
    Ok(())
}
