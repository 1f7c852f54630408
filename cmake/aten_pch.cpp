// The one unit of torchtpu_aten_pic and torchtpu_aten_pie (cmake/Torch.cmake), the targets that
// own the precompiled <ATen/ATen.h> the other targets reuse. It compiles to nothing.
