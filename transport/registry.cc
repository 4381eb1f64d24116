// The transports compiled into this build. Adding one means adding its ops table here.
#include "transport/transport.h"

namespace fusco {

extern const TransportOps kShmTransport;
#ifdef FUSCO_HAVE_UCX
extern const TransportOps kUcxTransport;
#endif
#ifdef FUSCO_HAVE_CUDA
extern const TransportOps kCudaIpcTransport;
#endif

const std::vector<const TransportOps*>& transportList() {
  static const std::vector<const TransportOps*> list = {
      &kShmTransport,
#ifdef FUSCO_HAVE_CUDA
      &kCudaIpcTransport,
#endif
#ifdef FUSCO_HAVE_UCX
      &kUcxTransport,
#endif
  };
  return list;
}

}  // namespace fusco
