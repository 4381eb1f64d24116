// Compiled against the engine room's include root alone (src/exec and the layers below it): every
// header of the engine room compiles without the engine.
#include "exec/bridge_ledger.h"
#include "exec/bridge_link.h"
#include "exec/device_queue.h"
#include "exec/exec_room.h"
#include "exec/net_bridge.h"
#include "exec/progress.h"
#include "exec/stream_ops.h"
