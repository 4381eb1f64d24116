#include "stop_signals.h"

#include <signal.h>
#include <unistd.h>

namespace fusco {
namespace perf {

namespace {

const int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
const int kNumSignals = sizeof(kSignals) / sizeof(kSignals[0]);
volatile sig_atomic_t g_owner = 0;   // the pid that holds them
volatile sig_atomic_t g_caught = 0;  // the first signal it noted
bool g_held[kNumSignals] = {};       // which of kSignals this process caught (left at default)
int g_depth = 0;                     // nested holds

// Async-signal-safe only: getpid, signal, raise and a sig_atomic_t store.
void onSignal(int sig) {
  if (getpid() != g_owner) {  // a child forked before it reset them: as if no handler were there
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  if (g_caught == 0) g_caught = sig;
}

void restoreDefaults() {
  for (int i = 0; i < kNumSignals; ++i) {
    if (g_held[i]) signal(kSignals[i], SIG_DFL);
    g_held[i] = false;
  }
}

}  // namespace

void holdStopSignals() {
  if (g_depth++ > 0) return;
  g_owner = getpid();
  g_caught = 0;
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // the waits poll the flag; no call needs to fail with EINTR for it
  for (int i = 0; i < kNumSignals; ++i) {
    struct sigaction old {};
    g_held[i] = sigaction(kSignals[i], nullptr, &old) == 0 && old.sa_handler == SIG_DFL &&
                (old.sa_flags & SA_SIGINFO) == 0 && sigaction(kSignals[i], &sa, nullptr) == 0;
  }
}

int releaseStopSignals() {
  if (g_depth == 0) return 0;
  if (--g_depth == 0) restoreDefaults();
  return g_caught;
}

int stopSignalCaught() { return g_depth > 0 ? g_caught : 0; }

void stopSignalsInChild() {
  restoreDefaults();
  g_depth = 0;
  g_caught = 0;
}

}  // namespace perf
}  // namespace fusco
