#include "runtime/parallel/transfer_stream.h"

namespace fsdp {

const Stream& TransferStream::after(Context& ctx) {
  if (!stream_.is_cuda()) stream_ = Stream::create_cuda(ctx.device().index, -1);
  Event ready;
  ready.record(ctx.stream());
  stream_.wait(ready);
  return stream_;
}

}  // namespace fsdp
