// The snippet of docs/distributed.md, "Mixture-of-experts groups", made a translation unit; the
// stand-ins are optimizer (that of "Data parallel over MPI"), rank, E, local_experts, w1 and w1_grad.
#include <mpopt/adam.hpp>
#include <mpopt/mpi.hpp>
#include <mpopt/optimizer.hpp>

#include <string>
#include <vector>

using optimizer = mpopt::optimizer<mpopt::bf16, mpopt::no_scaling, mpopt::replicated, mpopt::adam,
                                   mpopt::host, mpopt::mpi>;

void experts(int rank, int E, int local_experts, std::vector<std::vector<mpopt::bfloat16>>& w1,
             std::vector<std::vector<mpopt::bfloat16>>& w1_grad) {
  // DeepSpeed's E+D layout: rank r holds set r % E of the experts; its replicas are the ranks r % E + kE.
  MPI_Comm replicas;
  MPI_Comm_split(MPI_COMM_WORLD, rank % E, rank, &replicas);
  optimizer opt{mpopt::mpi{MPI_COMM_WORLD}, {.clip_grad = 1.0}};
  auto& dense = opt.add_group({.lr = 3e-4, .weight_decay = 0.1});
  auto& experts = opt.add_expert_group({.lr = 3e-4, .weight_decay = 0.1}, mpopt::mpi{replicas});
  for (int l = 0; l < local_experts; ++l) {  // name each by its global expert id
    const int id = (rank % E) * local_experts + l;
    experts.add(w1[l], w1_grad[l], "expert" + std::to_string(id) + ".w1");
  }
  (void)dense;  // the dense tensors would be added to it
}
