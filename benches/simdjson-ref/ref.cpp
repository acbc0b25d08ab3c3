// The C++ simdjson library's full parse (stage 1 and stage 2: every byte
// validated, the tape built) of one message, timed: a reference for what the
// state of the art costs on pollbox's bench bodies (benches/simdjson-ref/run.sh).
//
//   ref BODY_FILE ITERATIONS   -> prints the kernel, bytes and ns per parse
#include <simdjson.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: ref BODY_FILE ITERATIONS\n");
        return 2;
    }
    simdjson::padded_string body;
    if (simdjson::padded_string::load(argv[1]).get(body)) {
        std::fprintf(stderr, "ref: cannot read %s\n", argv[1]);
        return 2;
    }
    long iters = std::atol(argv[2]);
    simdjson::dom::parser parser;
    size_t checksum = 0;
    auto start = std::chrono::steady_clock::now();
    for (long k = 0; k < iters; k++) {
        simdjson::dom::element doc;
        if (parser.parse(body).get(doc)) {
            std::fprintf(stderr, "ref: invalid JSON\n");
            return 1;
        }
        checksum += doc.is_object();
    }
    auto ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    std::printf("simdjson (%s): %zu bytes, %ld parses, %.0f ns per parse (checksum %zu)\n",
                simdjson::get_active_implementation()->name().c_str(), body.size(),
                iters, ns / iters, checksum);
    return 0;
}
