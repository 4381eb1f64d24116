// Compiled against the engine room's include root (src/exec, docs/DESIGN.md "Layers"): the engine
// sits above it, so this include must not resolve, and the build refuses it.
#include "engine/communicator.h"
