// llama.cpp's mirostat samplers on fixed logit rows: the reference token streams that
// tests/sampling/test_sampling_mirostat.py checks pyllama's MirostatSampler / MirostatV2Sampler
// against (tests/data/sampling/mirostat_reference.json).
//
// No model is needed: a mirostat sampler only sees the candidate array. For each run the
// program builds one sampler, then for every row of the logits file fills a
// llama_token_data_array (ids 0..n_vocab-1, unsorted, selected = -1), calls
// llama_sampler_apply + llama_sampler_accept and prints the selected token id, the number
// of candidates left after the truncation and the selected candidate's probability.
//
// Build (libllama from the llama.cpp source pyllama follows, commit 0c1e570; any build
// directory outside the repository, e.g. with cmake/ninja from PyPI in a separate venv):
//
//   cmake -S vendor/llama.cpp -B /work/cache/llama-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
//         -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
//         -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
//   cmake --build /work/cache/llama-build --target llama
//   g++ -O2 -std=c++17 tools/mirostat_reference.cpp -I vendor/llama.cpp/include \
//       -I vendor/llama.cpp/ggml/include -L /work/cache/llama-build/bin -lllama \
//       -Wl,-rpath,/work/cache/llama-build/bin -o /work/cache/mirostat_reference
//
// Run (tools/mirostat_reference.py does all of this and writes the JSON file):
//
//   mirostat_reference LOGITS.f32 N_VOCAB N_STEPS  RUN...
//
// LOGITS.f32 holds N_STEPS rows of N_VOCAB little-endian float32 logits. Each RUN is
// "1:SEED:TAU:ETA:M" (llama_sampler_init_mirostat(N_VOCAB, SEED, TAU, ETA, M)) or
// "2:SEED:TAU:ETA" (llama_sampler_init_mirostat_v2(SEED, TAU, ETA)); "1r:..." / "2r:..."
// reset the sampler before every step (each row is then sampled with mu = 2 * tau).
// Output: one line per run, "RUN tok,size,p tok,size,p ..." with p printed as %a (exact).

#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 5) {
        std::fprintf(stderr, "usage: %s LOGITS.f32 N_VOCAB N_STEPS RUN...\n", argv[0]);
        return 2;
    }
    const int n_vocab = std::atoi(argv[2]);
    const int n_steps = std::atoi(argv[3]);

    std::vector<float> logits((size_t) n_vocab * n_steps);
    FILE * f = std::fopen(argv[1], "rb");
    if (!f || std::fread(logits.data(), sizeof(float), logits.size(), f) != logits.size()) {
        std::fprintf(stderr, "cannot read %d x %d float32 from %s\n", n_steps, n_vocab, argv[1]);
        return 1;
    }
    std::fclose(f);

    std::vector<llama_token_data> data(n_vocab);
    for (int r = 4; r < argc; ++r) {
        const std::string spec = argv[r];
        // "1:..." / "2:...", or "1r:..." / "2r:...": llama_sampler_reset before every step,
        // so each row is sampled with the initial mu = 2 * tau and a freshly seeded rng
        const bool reset = spec.size() > 1 && spec[1] == 'r';
        const char * args = spec.c_str() + (reset ? 3 : 2);
        unsigned seed = 0;
        float tau = 0, eta = 0;
        int m = 100;
        llama_sampler * smpl = nullptr;
        if (spec[0] == '1' && std::sscanf(args, "%u:%f:%f:%d", &seed, &tau, &eta, &m) == 4) {
            smpl = llama_sampler_init_mirostat(n_vocab, seed, tau, eta, m);
        } else if (spec[0] == '2' && std::sscanf(args, "%u:%f:%f", &seed, &tau, &eta) == 3) {
            smpl = llama_sampler_init_mirostat_v2(seed, tau, eta);
        } else {
            std::fprintf(stderr, "bad run spec %s\n", spec.c_str());
            return 2;
        }
        std::printf("%s", spec.c_str());
        for (int s = 0; s < n_steps; ++s) {
            if (reset) {
                llama_sampler_reset(smpl);
            }
            const float * row = logits.data() + (size_t) s * n_vocab;
            for (int i = 0; i < n_vocab; ++i) {
                data[i] = llama_token_data{ i, row[i], 0.0f };
            }
            llama_token_data_array cur = { data.data(), (size_t) n_vocab, -1, false };
            llama_sampler_apply(smpl, &cur);
            const llama_token tok = cur.data[cur.selected].id;
            std::printf(" %d,%zu,%a", tok, cur.size, cur.data[cur.selected].p);
            llama_sampler_accept(smpl, tok);
        }
        std::printf("\n");
        llama_sampler_free(smpl);
    }
    return 0;
}
