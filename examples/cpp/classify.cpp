// Early exit in one ONNX file, served by ONNX Runtime's C++ API: no Python, no code of ours
// (docs/onnx_single_file.md). Build: examples/cpp/build.sh (headers and library: examples/cpp/get_onnxruntime.sh).
//
//   classify MODEL.onnx [THRESHOLD] < rows.txt
//
// One input per line, as a tokenizer makes it (the export's tokenizer.json): its token ids separated by spaces,
// then optionally " | " and its token type ids (a pair of texts); each input runs alone (batch 1, no padding).
// One output line per input: "label exit_layer flops". THRESHOLD (optional) replaces the operating point saved in
// the file: it is fed to the file's optional `threshold` input, which otherwise keeps its saved value.
#include <onnxruntime_cxx_api.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::istringstream stream(text);
  int64_t id;
  while (stream >> id) ids.push_back(id);
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: classify MODEL.onnx [THRESHOLD] < rows.txt (token ids per line [| token type ids])\n";
    return 2;
  }
  try {
    Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "elasticbert-early-exit");
    Ort::SessionOptions options;
    options.SetIntraOpNumThreads(1);
    Ort::Session session(env, argv[1], options);
    Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    const bool given_threshold = argc > 2;
    float threshold = given_threshold ? std::strtof(argv[2], nullptr) : 0.0f;
    const char* input_names[] = {"input_ids", "attention_mask", "token_type_ids", "threshold"};
    const char* output_names[] = {"label", "exit_layer", "flops"};
    std::string line;
    while (std::getline(std::cin, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const auto bar = line.find('|');
      std::vector<int64_t> ids = parse_ids(line.substr(0, bar));
      std::vector<int64_t> types = bar == std::string::npos ? std::vector<int64_t>(ids.size(), 0)
                                                            : parse_ids(line.substr(bar + 1));
      if (ids.empty() || types.size() != ids.size()) {
        std::cerr << "classify: a line needs token ids, and as many token type ids after '|' when given\n";
        return 2;
      }
      std::vector<int64_t> mask(ids.size(), 1);
      const int64_t shape[] = {1, static_cast<int64_t>(ids.size())};
      std::vector<Ort::Value> inputs;
      inputs.push_back(Ort::Value::CreateTensor<int64_t>(memory, ids.data(), ids.size(), shape, 2));
      inputs.push_back(Ort::Value::CreateTensor<int64_t>(memory, mask.data(), mask.size(), shape, 2));
      inputs.push_back(Ort::Value::CreateTensor<int64_t>(memory, types.data(), types.size(), shape, 2));
      if (given_threshold) {
        inputs.push_back(Ort::Value::CreateTensor<float>(memory, &threshold, 1, nullptr, 0));
      }
      auto outputs = session.Run(Ort::RunOptions{nullptr}, input_names, inputs.data(), inputs.size(), output_names, 3);
      std::cout << outputs[0].GetTensorData<int64_t>()[0] << ' ' << outputs[1].GetTensorData<int64_t>()[0] << ' '
                << outputs[2].GetTensorData<int64_t>()[0] << '\n';
    }
  } catch (const Ort::Exception& error) {
    std::cerr << "classify: " << error.what() << '\n';
    return 1;
  }
  return 0;
}
