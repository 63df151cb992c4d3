// tokenizes texts with llama.cpp (vocab only) for cross-checking pyllama
// usage: harness model.gguf input.bin > output.txt
// input: repeated [u32 little-endian length][bytes]
// output per text: 4 lines "a p: ids..." then "d: hex of detokenize(ids add0 parse1)"
#include "llama.h"
#include <cstdio>
#include <cstdint>
#include <vector>
#include <string>
int main(int argc, char ** argv) {
    llama_backend_init();
    llama_log_set([](enum ggml_log_level, const char *, void *) {}, nullptr);
    auto mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    FILE * f = fopen(argv[2], "rb");
    uint32_t len;
    while (fread(&len, 4, 1, f) == 1) {
        std::string s(len, '\0');
        if (len && fread(&s[0], 1, len, f) != len) return 2;
        std::vector<llama_token> keep;
        for (int a = 0; a < 2; a++) for (int p = 0; p < 2; p++) {
            std::vector<llama_token> t(len + 16);
            int n = llama_tokenize(vocab, s.data(), (int) len, t.data(), (int) t.size(), a, p);
            if (n < 0) { t.resize(-n); n = llama_tokenize(vocab, s.data(), (int) len, t.data(), (int) t.size(), a, p); }
            t.resize(n);
            printf("%d %d:", a, p);
            for (auto x : t) printf(" %d", x);
            printf("\n");
            if (a == 0 && p == 1) keep = t;
        }
        std::vector<char> buf(len * 4 + 256);
        int n = llama_detokenize(vocab, keep.data(), (int) keep.size(), buf.data(), (int) buf.size(), false, false);
        if (n < 0) { buf.resize(-n); n = llama_detokenize(vocab, keep.data(), (int) keep.size(), buf.data(), (int) buf.size(), false, false); }
        printf("d:");
        for (int i = 0; i < n; i++) printf("%02x", (unsigned char) buf[i]);
        printf("\n");
    }
    return 0;
}
