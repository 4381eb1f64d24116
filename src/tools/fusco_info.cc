// fusco_info: prints the version, every parameter (value in force, default, where the value came
// from, whether the given text was accepted) and the transports compiled into this build.
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/params.h"
#include "device/cuda_rt.h"
#include "fusco.h"
#include "transport/transport.h"

namespace {

void printParams() {
  printf("%-26s %-12s %-12s %-9s %s\n", "parameter", "value", "default", "source", "description");
  const std::vector<fusco::ParamInfo> list = fusco::paramList();
  int rejected = 0;
  for (const auto& p : list) {
    // A rejected text: the value shown is the default in force, the source says where the text
    // came from and is marked "!".
    const std::string source = p.source + (p.valid ? "" : "!");
    printf("%-26s %-12s %-12s %-9s %s\n", p.name, p.value.empty() ? "\"\"" : p.value.c_str(),
           p.defaultValue[0] ? p.defaultValue : "\"\"", source.c_str(), p.help);
    rejected += p.valid ? 0 : 1;
  }
  if (rejected == 0) return;
  printf("\ninvalid (!): rejected, the default is used instead:\n");
  for (const auto& p : list) {
    if (p.valid) continue;
    printf("  %s=\"%s\" is not %s\n", p.name, p.rejected.c_str(), p.accepted.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    printf(
        "usage: fusco_info\nPrints the fusco version, every FUSCO_* parameter and the "
        "transports.\n");
    return 0;
  }
  int version = 0;
  fuscoGetVersion(&version);
  printf("fusco %d.%d.%d\n\n", version / 10000, (version / 100) % 100, version % 100);
  printParams();
  printf("\ntransports:\n");
  for (const auto* t : fusco::transportList()) printf("  %s\n", t->name);
  // What the device layer was built with (FUSCO_HAVE_CUDA there), not a macro of this file's.
  printf("cuda: %s\n", fusco::cudaBuilt() ? "compiled in" : "not compiled in");
  return 0;
}
