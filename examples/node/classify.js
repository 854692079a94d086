// Early exit in one ONNX file, served by onnxruntime-node: no Python, no code of ours (docs/onnx_single_file.md).
//
//   node classify.js MODEL.onnx < batches.jsonl
//
// Each input line is one batch of token ids, right-padded, as a tokenizer makes them (the export's tokenizer.json:
// @huggingface/tokenizers, tokenizers in Rust, or any WordPiece implementation with the same vocabulary):
//   {"input_ids": [[101, 2009, 102]], "attention_mask": [[1, 1, 1]], "token_type_ids": [[0, 0, 0]]}
// Each output line: {"label": [...], "exit_layer": [...], "flops": [...], "probabilities": [[...]]}, one entry per
// row; labels are class ids (the file's id2label metadata, also in the export's onnx/manifest.json, names them).
// The file runs the operating point saved in it: onnxruntime-node feeds a session's `inputNames` only, so its
// optional threshold inputs keep their saved values here (Python and C++ can feed them).
"use strict";

const fs = require("fs");
const readline = require("readline");
const ort = require("onnxruntime-node");

function int64Tensor(rows) {
  const width = rows[0].length;
  const data = BigInt64Array.from(rows.flat(), (value) => BigInt(value));
  return new ort.Tensor("int64", data, [rows.length, width]);
}

async function main() {
  const modelPath = process.argv[2];
  if (!modelPath || !fs.existsSync(modelPath)) {
    console.error("usage: node classify.js MODEL.onnx < batches.jsonl (one batch of token ids per line)");
    process.exit(2);
  }
  const options = { intraOpNumThreads: Number(process.env.THREADS || 1), logSeverityLevel: 3 };
  const session = await ort.InferenceSession.create(modelPath, options);
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    if (!line.trim()) continue;
    const batch = JSON.parse(line);
    const feeds = {
      input_ids: int64Tensor(batch.input_ids),
      attention_mask: int64Tensor(batch.attention_mask),
      token_type_ids: int64Tensor(batch.token_type_ids),
    };
    const out = await session.run(feeds);
    const k = out.logits.dims[1];
    const rows = out.exit_layer.dims[0];
    const answer = {
      label: Array.from(out.label.data, Number),
      exit_layer: Array.from(out.exit_layer.data, Number),
      flops: Array.from(out.flops.data, Number),
      probabilities: Array.from({ length: rows }, (_, r) => Array.from(out.probabilities.data.slice(r * k, (r + 1) * k))),
    };
    process.stdout.write(JSON.stringify(answer) + "\n");
  }
}

main().catch((error) => {
  console.error(`classify.js: ${error.message}`);
  process.exit(1);
});
