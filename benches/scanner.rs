//! Scanner throughput on a realistic 4-round Search-R1 rollout, fed one token
//! (about 4 bytes) at a time, as the search loop feeds it.
//!
//! `cargo bench --bench scanner`; the report in bench/README.md turns the time per
//! token into a share of a decode step of the default model.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use seeker::scanner::{ScanEvent, TagScanner, TagSet};

/// The generated text of four rounds: reasoning, a search call (round 1-3) or
/// the answer (round 4), and the extra token mistral.rs emits after the tag.
fn rounds() -> Vec<String> {
    let think = "<think>The question asks about the painter of a famous portrait. I recall \
                 that the Mona Lisa hangs in the Louvre, but I am not sure who painted it, \
                 so I should look it up before answering; 東京 🗼 are not relevant.</think>\n";
    let mut rounds: Vec<String> = (0..3)
        .map(|i| format!("{think}<search> Mona Lisa painter {i} </search>\n\n"))
        .collect();
    rounds.push(format!("{think}<answer> Leonardo da Vinci </answer>\n"));
    rounds
}

/// Splits text into pieces of about `size` bytes at character boundaries.
fn tokens(text: &str, size: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + size).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(&text[start..end]);
        start = end;
    }
    out
}

fn bench(c: &mut Criterion) {
    let rounds = rounds();
    let pieces: Vec<Vec<&str>> = rounds.iter().map(|r| tokens(r, 4)).collect();
    let bytes: usize = rounds.iter().map(String::len).sum();
    let count: usize = pieces.iter().map(Vec::len).sum();
    let tags = TagSet::new(
        "<search>",
        "</search>",
        "<answer>",
        "</answer>",
        "<information>",
    );
    let mut group = c.benchmark_group("scanner");
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function(format!("4 rounds, {count} tokens"), |b| {
        let mut scanner = TagScanner::new(tags.clone());
        let mut out: Vec<ScanEvent> = Vec::new();
        b.iter(|| {
            let mut events = 0;
            for round in &pieces {
                scanner.reset();
                for piece in round {
                    scanner.push(piece, &mut out);
                    events += out.len();
                    out.clear();
                    if scanner.is_done() {
                        break;
                    }
                }
            }
            events
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
