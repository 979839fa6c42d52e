# An example GPU cluster on AWS: three Nomad+Consul servers and an autoscaling
# group of GPU clients configured by ../../modules/gpu-node's cloud-init, then
# the cluster configuration (namespaces, preemption, ACLs, the broker) from
# ../../modules/cluster-config. A starting point to adapt (network, images,
# TLS, ACL bootstrap), not a hardened production layout.

terraform {
  required_version = ">= 1.6.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
    nomad = {
      source  = "hashicorp/nomad"
      version = ">= 2.1.0"
    }
    consul = {
      source  = "hashicorp/consul"
      version = ">= 2.20.0"
    }
  }
}

provider "aws" {
  region = var.region
}

# The nomad and consul providers reach the servers once they are up; apply in
# two steps (-target=aws_autoscaling_group.gpu first) on a new cluster.
provider "nomad" {
  address   = "http://${aws_instance.server[0].private_ip}:4646"
  secret_id = var.nomad_bootstrap_token
}

provider "consul" {
  address = "${aws_instance.server[0].private_ip}:8500"
  token   = var.consul_bootstrap_token
}

locals {
  join_tag = "nomad-gpu-${var.cluster_name}"
}

resource "aws_security_group" "cluster" {
  name_prefix = "${var.cluster_name}-"
  vpc_id      = var.vpc_id

  # Nomad (HTTP, RPC, Serf), Consul (RPC, Serf LAN, HTTP) and the broker,
  # between members of the cluster only.
  dynamic "ingress" {
    for_each = [4646, 4647, 4648, 4649, 8300, 8301, 8500]
    content {
      from_port = ingress.value
      to_port   = ingress.value
      protocol  = "tcp"
      self      = true
    }
  }

  ingress {
    from_port = 8301
    to_port   = 8301
    protocol  = "udp"
    self      = true
  }

  ingress {
    from_port = 4648
    to_port   = 4648
    protocol  = "udp"
    self      = true
  }

  # Users reach the broker (which proxies Nomad's API) from the office network.
  ingress {
    from_port   = 4649
    to_port     = 4649
    protocol    = "tcp"
    cidr_blocks = var.user_cidrs
  }

  egress {
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    cidr_blocks = ["0.0.0.0/0"]
  }
}

resource "aws_iam_role" "node" {
  name_prefix = "${var.cluster_name}-"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
}

# Consul's cloud auto-join lists instances by tag.
resource "aws_iam_role_policy" "describe" {
  role = aws_iam_role.node.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect   = "Allow"
      Action   = ["ec2:DescribeInstances"]
      Resource = "*"
    }]
  })
}

resource "aws_iam_instance_profile" "node" {
  name_prefix = "${var.cluster_name}-"
  role        = aws_iam_role.node.name
}

resource "aws_instance" "server" {
  count = 3

  ami                    = var.server_ami
  instance_type          = var.server_instance_type
  subnet_id              = var.subnet_ids[count.index % length(var.subnet_ids)]
  vpc_security_group_ids = [aws_security_group.cluster.id]
  iam_instance_profile   = aws_iam_instance_profile.node.name

  # The server image carries nomad and consul; this only configures them.
  # Their files replace those of HashiCorp's packages: that nomad.hcl makes
  # a one-node server and a client, which a file beside it cannot undo.
  user_data = <<-EOT
    #cloud-config
    write_files:
      - path: /etc/consul.d/consul.hcl
        content: |
          datacenter           = "dc1"
          data_dir             = "/opt/consul/data"
          server               = true
          bootstrap_expect     = 3
          bind_addr            = "{{ GetPrivateIP }}"
          client_addr          = "0.0.0.0"
          retry_join           = ["provider=aws tag_key=cluster tag_value=${local.join_tag}"]
          acl {
            enabled        = true
            default_policy = "deny"
          }
          disable_update_check = true
      - path: /etc/nomad.d/nomad.hcl
        content: |
          datacenter           = "dc1"
          data_dir             = "/opt/nomad/data"
          bind_addr            = "{{ GetPrivateIP }}"
          disable_update_check = true
          server {
            enabled          = true
            bootstrap_expect = 3
          }
          acl {
            enabled = true
          }
    runcmd:
      - [systemctl, enable, --now, consul.service, nomad.service]
  EOT

  tags = {
    Name    = "${var.cluster_name}-server-${count.index}"
    cluster = local.join_tag
  }
}

module "gpu_node" {
  source = "../../modules/gpu-node"

  datacenter        = "dc1"
  node_pool         = "gpu"
  bind_addr         = "{{ GetPrivateIP }}"
  nomad_servers     = [for s in aws_instance.server : "${s.private_ip}:4647"]
  consul_retry_join = ["provider=aws tag_key=cluster tag_value=${local.join_tag}"]
  plugin_url        = var.plugin_url
  plugin_sha256     = var.plugin_sha256
  plugin_version    = var.plugin_version
  plugin_config = {
    backend = "nvml"
  }
  # The first GPU of each node is time-sliced into 4 for notebooks.
  gpu_sharing = var.shared_gpus_per_node > 0 ? { replicas = 4, gpus = var.shared_gpus_per_node } : null
  host_volumes = {
    checkpoints = { path = "/mnt/checkpoints" } # an EFS/FSx mount, the same on every node
  }
  extra_nomad_hcl = <<-EOT
    acl {
      enabled = true
    }
  EOT
}

resource "aws_launch_template" "gpu" {
  name_prefix   = "${var.cluster_name}-gpu-"
  image_id      = var.gpu_ami
  instance_type = var.gpu_instance_type
  user_data     = base64encode(module.gpu_node.cloud_init)

  iam_instance_profile {
    name = aws_iam_instance_profile.node.name
  }

  vpc_security_group_ids = [aws_security_group.cluster.id]

  tag_specifications {
    resource_type = "instance"
    tags = {
      Name    = "${var.cluster_name}-gpu"
      cluster = local.join_tag
    }
  }
}

resource "aws_autoscaling_group" "gpu" {
  name_prefix         = "${var.cluster_name}-gpu-"
  min_size            = var.gpu_nodes_min
  max_size            = var.gpu_nodes_max
  desired_capacity    = var.gpu_nodes_min
  vpc_zone_identifier = var.subnet_ids

  launch_template {
    id      = aws_launch_template.gpu.id
    version = "$Latest"
  }
}

module "cluster_config" {
  source = "../../modules/cluster-config"

  tenants     = jsondecode(file(var.tenants_file)).tenants
  policy_dir  = var.policy_dir
  enforcement = "exclusive"
  broker = {
    count     = 2
    node_pool = "gpu" # the only clients here; the broker takes no GPU
  }

  depends_on = [aws_autoscaling_group.gpu]
}
