//! `k8s_openapi::Resource`/`Metadata` for the cluster types, so that kube-rs clients
//! (`kube::Api<EtcdCluster>`) work with them unchanged.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::{v1alpha1, v1alpha2};

macro_rules! impl_resource {
    ($module:ident) => {
        impl k8s_openapi::Resource for $module::EtcdCluster {
            const API_VERSION: &'static str = $module::API_VERSION;
            const GROUP: &'static str = crate::GROUP;
            const KIND: &'static str = crate::KIND;
            const VERSION: &'static str = $module::VERSION;
            const URL_PATH_SEGMENT: &'static str = crate::RESOURCE;
            type Scope = k8s_openapi::NamespaceResourceScope;
        }

        impl k8s_openapi::ListableResource for $module::EtcdCluster {
            const LIST_KIND: &'static str = crate::LIST_KIND;
        }

        impl k8s_openapi::Metadata for $module::EtcdCluster {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

impl_resource!(v1alpha1);
impl_resource!(v1alpha2);
