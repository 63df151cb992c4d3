// llama.cpp side of benchmarks/bench_tokenize.py: vocab-only load time and best-of-5 llama_tokenize
// of a text file. Build against libllama as in tests/data/tokenizer/crosscheck/make_crosscheck.py,
// then: ./bench_tokenize_llamacpp MODEL.gguf text-gpl3.txt
#include "llama.h"
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
int main(int argc, char ** argv) {
    llama_backend_init();
    llama_log_set([](enum ggml_log_level, const char *, void *) {}, nullptr);
    auto mp = llama_model_default_params();
    mp.vocab_only = true;
    auto t0 = std::chrono::steady_clock::now();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    auto t1 = std::chrono::steady_clock::now();
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::ifstream f(argv[2]); std::stringstream ss; ss << f.rdbuf(); std::string s = ss.str();
    std::vector<llama_token> t(s.size() + 16);
    double best = 1e9; int n = 0;
    for (int r = 0; r < 5; r++) {
        auto a = std::chrono::steady_clock::now();
        n = llama_tokenize(vocab, s.data(), (int) s.size(), t.data(), (int) t.size(), true, false);
        auto b = std::chrono::steady_clock::now();
        best = std::min(best, std::chrono::duration<double, std::milli>(b - a).count());
    }
    printf("load(vocab_only) %.1f ms  tokenize best of 5: %.2f ms  %d tokens\n", std::chrono::duration<double, std::milli>(t1 - t0).count(), best, n);
}
