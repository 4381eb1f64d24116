// The signals that stop a run (SIGINT, SIGTERM, SIGHUP, SIGPIPE), in a perf binary's parent.
//
// The parent of -np ranks, and the owner of a private MPS daemon (mps_daemon.h), must not die at
// once on them: Ctrl-C, a timeout's or a scheduler's SIGTERM (Popen.terminate() sends it to the
// parent alone) or a closed output pipe would leave its ranks running as orphans and the daemon,
// folder included, behind. While the signals are held, one is only noted (the handler sets a flag,
// nothing else); the parent's waits read it, pass SIGTERM on to the ranks, stop the daemon and
// return 128 + the signal.
//
// Holds nest (the MPS owner holds across the whole run, the launcher while its ranks run); the
// outermost release restores the default actions. Only signals left at their default are held
// (nohup's ignored SIGHUP stays ignored). A forked rank calls stopSignalsInChild() first: it ends
// on these signals as any process does, and one that comes before that call takes the default
// action too (the handler knows the pid that holds them).
//
// Nothing here calls exit().
#pragma once

namespace fusco {
namespace perf {

// Holds the signals in this process (the outermost hold forgets any signal noted before).
void holdStopSignals();

// Ends one hold; the outermost restores the default actions. Returns the signal noted since the
// outermost hold (0: none).
int releaseStopSignals();

// The first signal noted since the outermost hold (0: none); 0 where nothing is held.
int stopSignalCaught();

// In a process just forked from a holder: the default actions back, nothing held or noted.
void stopSignalsInChild();

}  // namespace perf
}  // namespace fusco
