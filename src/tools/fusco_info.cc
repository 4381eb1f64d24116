// fusco_info: prints the version, every parameter (value, default, where the value came from) and
// the transports compiled into this build.
#include <cstdio>
#include <cstring>

#include "core/params.h"
#include "fusco.h"
#include "transport/transport.h"

int main(int argc, char** argv) {
  if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    printf("usage: fusco_info\nPrints the fusco version, every FUSCO_* parameter and the transports.\n");
    return 0;
  }
  int version = 0;
  fuscoGetVersion(&version);
  printf("fusco %d.%d.%d\n\n", version / 10000, (version / 100) % 100, version % 100);
  printf("%-26s %-12s %-12s %-8s %s\n", "parameter", "value", "default", "source", "description");
  for (const auto& p : fusco::paramList()) {
    printf("%-26s %-12s %-12s %-8s %s\n", p.name, p.value.empty() ? "\"\"" : p.value.c_str(),
           p.defaultValue[0] ? p.defaultValue : "\"\"", p.source.c_str(), p.help);
  }
  printf("\ntransports:\n");
  for (const auto* t : fusco::transportList()) printf("  %s\n", t->name);
#ifdef FUSCO_HAVE_CUDA_BUILD
  printf("cuda: compiled in\n");
#else
  printf("cuda: not compiled in\n");
#endif
  return 0;
}
